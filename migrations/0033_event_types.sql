-- The event-type catalog (issue 34, item 3): what a tenant's event types are, for its
-- customers to browse (the portal) and for its producers to be checked against (a message
-- sent with "validate": true). A type is owned by the API or by one WebhookEventType
-- object, like an endpoint or a source (`managed_by`); the object is found by namespace and
-- name, and the type's name may differ from the object's (object names cannot hold '_' or
-- upper case, event types can).
--
-- `schema` is the JSON Schema the caller sent, as jsonb (it is read to compile, never
-- signed); `example` is the caller's exact text, as a payload is. Their sizes are bounded
-- in `catalog` (64 KiB each, as sent); the CHECKs are a backstop for any other door (the
-- schema at twice that: jsonb prints with spaces the sender may have left out).
--
-- `version` comes from one sequence and changes with every write: an API process keeps each
-- compiled schema under its version, so a change (or a delete and a re-create, which a
-- timestamp could not tell apart within a transaction) is seen by the next message.
--
-- Reserved types (`hookd.` …) are hookd's own and are not stored: the catalog shows the
-- operational ones from `catalog::RESERVED`; the CHECK keeps any door from declaring one.
CREATE SEQUENCE hookd.event_type_versions;

CREATE TABLE hookd.event_types (
    tenant text NOT NULL,
    name text NOT NULL,
    description text,
    schema jsonb,
    example text,
    deprecated boolean NOT NULL DEFAULT false,
    deprecation_note text,
    managed_by text NOT NULL DEFAULT 'api'
        CONSTRAINT event_types_managed_by CHECK (managed_by IN ('kubernetes', 'api')),
    k8s_namespace text,
    k8s_name text,
    version bigint NOT NULL DEFAULT nextval('hookd.event_type_versions'),
    created_at timestamptz NOT NULL DEFAULT now(),
    updated_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (tenant, name),
    CONSTRAINT event_types_k8s_object
        CHECK ((managed_by = 'kubernetes') = (k8s_namespace IS NOT NULL AND k8s_name IS NOT NULL)),
    CONSTRAINT event_types_name_syntax
        CHECK (length(name) <= 128 AND name ~ '^[A-Za-z0-9_-]+(\.[A-Za-z0-9_-]+)*$'),
    CONSTRAINT event_types_not_reserved CHECK (NOT hookd.is_reserved_event_type(name)),
    CONSTRAINT event_types_description_length CHECK (char_length(description) <= 1000),
    CONSTRAINT event_types_note_length CHECK (char_length(deprecation_note) <= 1000),
    CONSTRAINT event_types_example_size CHECK (octet_length(example) <= 65536),
    CONSTRAINT event_types_schema_size CHECK (octet_length(schema::text) <= 131072)
);

CREATE UNIQUE INDEX event_types_k8s_object_key ON hookd.event_types (k8s_namespace, k8s_name)
    WHERE managed_by = 'kubernetes';

-- Any write moves the version, whichever door makes it (an operator's UPDATE too): API
-- processes keep compiled schemas by version, and a write that left it as it was would be
-- served stale until they restart.
CREATE FUNCTION hookd.event_type_new_version() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    NEW.version := nextval('hookd.event_type_versions');
    RETURN NEW;
END
$$;

CREATE TRIGGER event_types_version BEFORE UPDATE ON hookd.event_types
    FOR EACH ROW EXECUTE FUNCTION hookd.event_type_new_version();
