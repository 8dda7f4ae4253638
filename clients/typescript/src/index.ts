// The typed hookd client: openapi-fetch over the types openapi-typescript generates from
// ../openapi.json (src/schema.ts; `npm run generate` rewrites it, and
// scripts/clients.sh fails when it differs from the document).
import createFetchClient, { type Client } from "openapi-fetch";

import type { components, operations, paths } from "./schema.js";

export type { components, operations, paths };

/** Every error answer of the API: `{"error": {"code", "message"}}`. */
export type ErrorBody = components["schemas"]["ErrorBody"];

export type HookdClient = Client<paths, "application/json">;

export interface HookdClientOptions {
  /** The API's base URL, e.g. `http://127.0.0.1:8080` (no `/v1`). */
  baseUrl: string;
  /** A `hookd_…` API token or a Kubernetes ServiceAccount token (audience `hookd`). */
  token: string;
  /** A fetch implementation other than the global one. */
  fetch?: typeof globalThis.fetch;
}

/**
 * A client for every route of the document, sending `token` as the bearer credential.
 * Calls answer `{ data, error, response }`: `data` typed by the route's 2xx answer,
 * `error` by its error answers (an `ErrorBody`).
 */
export function createClient(options: HookdClientOptions): HookdClient {
  return createFetchClient<paths>({
    baseUrl: options.baseUrl.replace(/\/+$/, ""),
    headers: { authorization: `Bearer ${options.token}` },
    ...(options.fetch ? { fetch: options.fetch } : {}),
  });
}
