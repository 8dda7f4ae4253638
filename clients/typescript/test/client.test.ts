// @hookd/client against a live `hookd api` (scripts/clients.sh starts one and passes
// HOOKD_URL and a token of tenant `clients` with scopes produce and read as HOOKD_TOKEN).
import assert from "node:assert/strict";
import { execFile } from "node:child_process";
import { randomUUID } from "node:crypto";
import { fileURLToPath } from "node:url";
import { test } from "node:test";
import { promisify } from "node:util";

import { createClient, type ErrorBody } from "@hookd/client";

const baseUrl = process.env.HOOKD_URL;
const token = process.env.HOOKD_TOKEN;
if (!baseUrl || !token) {
  throw new Error("HOOKD_URL and HOOKD_TOKEN must name a live hookd api (scripts/clients.sh)");
}
const hookd = createClient({ baseUrl, token });

test("the README example enqueues an event, and the client reads it back", async () => {
  const example = fileURLToPath(new URL("../examples/enqueue.js", import.meta.url));
  const { stdout } = await promisify(execFile)(process.execPath, [example], {
    env: { ...process.env, HOOKD_URL: baseUrl, HOOKD_TOKEN: token },
  });
  const eventId = stdout.trim().split(" ")[0] ?? "";
  assert.match(eventId, /^[0-9a-f-]{36}$/);

  const { data, error, response } = await hookd.GET("/v1/messages/{id}", {
    params: { path: { id: eventId } },
  });
  assert.equal(error, undefined);
  assert.equal(response.status, 200);
  assert.equal(data?.eventType, "invoice.paid");
  assert.deepEqual(data?.payload, { invoice: "in_1", amount: 4200 });
});

test("an idempotency key answers the original ids, with 200 rather than 201", async () => {
  const key = `ts-${randomUUID()}`;
  const send = () =>
    hookd.POST("/v1/messages", {
      body: { eventType: "order.paid", payload: { order: "o_1" }, idempotencyKey: key },
    });
  const first = await send();
  const again = await send();
  assert.equal(first.response.status, 201);
  assert.equal(again.response.status, 200);
  assert.ok(first.data && again.data);
  assert.equal(again.data.eventId, first.data.eventId);
  assert.deepEqual(again.data.deliveryIds, first.data.deliveryIds);

  // the same key with other content is a typed 409
  const other = await hookd.POST("/v1/messages", {
    body: { eventType: "order.paid", payload: { order: "o_2" }, idempotencyKey: key },
  });
  assert.equal(other.response.status, 409);
  assert.equal(other.error?.error.code, "idempotency_key_conflict");
});

test("errors arrive typed: 401 for a bad token, 422 for an invalid event type", async () => {
  const stranger = createClient({ baseUrl, token: "hookd_not-a-real-token" });
  const denied = await stranger.POST("/v1/messages", {
    body: { eventType: "invoice.paid", payload: {} },
  });
  assert.equal(denied.response.status, 401);
  const body: ErrorBody | undefined = denied.error;
  assert.equal(body?.error.code, "invalid_credential");

  const invalid = await hookd.POST("/v1/messages", {
    body: { eventType: "not a type", payload: {} },
  });
  assert.equal(invalid.response.status, 422);
  assert.equal(typeof invalid.error?.error.message, "string");
  assert.equal(invalid.data, undefined);
});
