// The README's TypeScript example, as written (tests/clients.rs checks that the two are the
// same); test/client.test.ts runs it against a live `hookd api` named by HOOKD_URL and
// HOOKD_TOKEN.
import { createClient } from "@hookd/client";
const hookd = createClient({ baseUrl: process.env.HOOKD_URL!, token: process.env.HOOKD_TOKEN! });
const { data, error } = await hookd.POST("/v1/messages", {
  params: { header: { "Idempotency-Key": "order-1" } },
  body: { eventType: "invoice.paid", payload: { invoice: "in_1", amount: 4200 } },
});
console.log(error ?? `${data.eventId} ${data.deliveryIds}`);
