-- WebhookSource objects (issue 33): a source is owned by the API or by one Kubernetes
-- object, like an endpoint (`endpoints.managed_by`). A declared source is changed only by
-- its object; the API reads it and refuses to change, rotate or delete it (409). The
-- object is found by namespace and name; its route name (`name`) is the object's name, so
-- two namespaces declaring one name get one source and the second is told NameTaken.
--
-- A NOT NULL column with a constant default and two nullable ones: no table rewrite.
ALTER TABLE hookd.sources
    ADD COLUMN managed_by text NOT NULL DEFAULT 'api'
        CONSTRAINT sources_managed_by CHECK (managed_by IN ('kubernetes', 'api')),
    ADD COLUMN k8s_namespace text,
    ADD COLUMN k8s_name text,
    ADD CONSTRAINT sources_k8s_object
        CHECK ((managed_by = 'kubernetes') = (k8s_namespace IS NOT NULL AND k8s_name IS NOT NULL));
CREATE UNIQUE INDEX sources_k8s_object_key ON hookd.sources (k8s_namespace, k8s_name)
    WHERE managed_by = 'kubernetes';
