"""A client generated from serve's own OpenAPI document (openapi-python-client)
calls every route and decodes every answer into the document's models
(tests/api_contract.rs, `a_generated_client_calls_every_route_and_decodes_every_answer`).

The sale (made by the test): voucher 1 live with 2 units, 2 not started,
3 ended, 4 paused, 5 one attempt a second, 6 requires a token, 7 live with
2 units and a per-user limit of 3, 8 live with 1 unit whose buyer has 2 s
to pay. A worker persists the orders and cancels unpaid ones.

Usage: python generated_client.py <client dir> <base url> <key> <read key>
Prints one line per call; exits 1 at the first answer that does not decode
as the document says.
"""

import sys
import time

sys.path.insert(0, sys.argv[1])

from seckill_client import AuthenticatedClient, Client  # noqa: E402
from seckill_client.api.meta import document_route, healthz, readyz  # noqa: E402
from seckill_client.api.orders import pay, show_order  # noqa: E402
from seckill_client.api.purchases import create, show_purchase  # noqa: E402
from seckill_client.api.vouchers import issue_token, show_voucher  # noqa: E402
from seckill_client.models import (  # noqa: E402
    BuyerAnswer,
    OrderAnswer,
    PaymentAnswer,
    Problem,
    PurchaseAnswer,
    PurchaseBody,
    ReadyAnswer,
    SaleAnswer,
    TokenAnswer,
    TokenBody,
)

base, key, read_key = sys.argv[2], sys.argv[3], sys.argv[4]
full = AuthenticatedClient(base_url=base, token=key, raise_on_unexpected_status=True)
reader = AuthenticatedClient(base_url=base, token=read_key, raise_on_unexpected_status=True)
nobody = Client(base_url=base, raise_on_unexpected_status=True)
failures = []


def expect(what, response, status, model, **fields):
    """The answer has `status` and decodes to `model` with `fields`."""
    parsed = response.parsed
    ok = response.status_code == status and isinstance(parsed, model)
    for name, want in fields.items():
        got = getattr(parsed, name, None)
        got = getattr(got, "value", got)
        ok = ok and got == want
    line = f"{what}: {response.status_code} {type(parsed).__name__}"
    print(("ok   " if ok else "FAIL ") + line + ("" if ok else f" (wanted {status} {model.__name__} {fields}): {response.content[:300]!r}"))
    if not ok:
        failures.append(line)
    return parsed


def buy(voucher, user, client=full, idempotency_key=None, **extra):
    keyed = {} if idempotency_key is None else {"idempotency_key": idempotency_key}
    return create.sync_detailed(str(voucher), client=client, body=PurchaseBody(user=user, **extra), **keyed)


first = expect("buy", buy(1, 1), 201, PurchaseAnswer, outcome="success", voucher="1", user="1")
expect("buy again", buy(1, 1), 409, PurchaseAnswer, outcome="already_bought")
expect("buy, the last unit", buy(1, 2), 201, PurchaseAnswer, outcome="success")
expect("sold out", buy(1, 3), 410, PurchaseAnswer, outcome="sold_out")
expect("not started", buy(2, 1), 425, PurchaseAnswer, outcome="not_started")
expect("ended", buy(3, 1), 422, PurchaseAnswer, outcome="ended")
expect("paused", buy(4, 1), 503, PurchaseAnswer, outcome="paused")
# One attempt a second per user: a user's second attempt right after the
# first is rate limited, unless a second passed between them (a loaded
# machine), when it is already_bought; then another user tries.
for user in range(100, 110):
    expect("rate", buy(5, user), 201, PurchaseAnswer)
    limited = buy(5, user)
    if limited.status_code == 429:
        break
expect("rate limited", limited, 429, PurchaseAnswer, outcome="rate_limited")
expect("no token", buy(6, 1), 403, PurchaseAnswer, outcome="bad_token")
expect("unknown voucher", buy(99, 1), 404, PurchaseAnswer, outcome="unknown_voucher")
expect("not enough", buy(7, 1, quantity=3), 412, PurchaseAnswer, outcome="not_enough_stock")
# Idempotency keys: the first answer again, byte for byte; a reuse refused.
keyed = buy(7, 50, idempotency_key="gen-key-1")
expect("buy with a key", keyed, 201, PurchaseAnswer, outcome="success")
again = buy(7, 50, idempotency_key="gen-key-1")
expect("the same key again", again, 201, PurchaseAnswer, order_id=keyed.parsed.order_id)
if again.headers.get("idempotent-replayed") != "true" or again.content != keyed.content:
    failures.append(f"a replay: {again.headers!r} {again.content!r}")
expect("the key for another user", buy(7, 51, idempotency_key="gen-key-1"), 422, Problem, code="idempotency_key_reused")
expect("a bad key", buy(7, 52, idempotency_key='"open'), 400, Problem, code="invalid_header")
expect("a read key buys", buy(1, 9, client=reader), 403, Problem, code="insufficient_scope")
expect("no key", buy(1, 9, client=nobody), 401, Problem, code="unauthorized")
expect("a bad voucher id", create.sync_detailed("08", client=full, body=PurchaseBody(user=9)), 400, Problem, code="invalid_id")

token = expect("token", issue_token.sync_detailed("6", client=full, body=TokenBody(user=1)), 200, TokenAnswer, voucher="6", user="1")
expect("buy with it", buy(6, 1, token=token.token), 201, PurchaseAnswer, outcome="success")
expect("token, unknown voucher", issue_token.sync_detailed("99", client=full, body=TokenBody(user=1)), 404, Problem, code="voucher_not_loaded")
expect("token, a read key", issue_token.sync_detailed("6", client=reader, body=TokenBody(user=1)), 403, Problem, code="insufficient_scope")

expect("the sale", show_voucher.sync_detailed("1", client=reader), 200, SaleAnswer, voucher="1")
expect("no such sale", show_voucher.sync_detailed("99", client=reader), 404, Problem, code="voucher_not_loaded")

order_id = first.order_id
deadline = time.monotonic() + 30
while True:
    shown = show_order.sync_detailed(order_id, client=reader)
    if shown.status_code == 200 or time.monotonic() > deadline:
        break
    time.sleep(0.1)
expect("the order", shown, 200, OrderAnswer, id=order_id, user="1", voucher="1")
expect("no such order", show_order.sync_detailed("12345", client=reader), 404, Problem, code="order_not_found")
bought = expect("bought?", show_purchase.sync_detailed("1", "1", client=reader), 200, BuyerAnswer, bought=True)
if not isinstance(bought.order, OrderAnswer) or bought.order.user != "1":
    failures.append(f"the lookup's order: {bought.order!r}")
expect("not bought", show_purchase.sync_detailed("1", "77", client=reader), 200, BuyerAnswer, bought=False, state="not_waiting")
expect("waiting", show_purchase.sync_detailed("1", "3", client=reader), 200, BuyerAnswer, state="waiting", position=1, ahead=0)
sale = expect("the sale's line", show_voucher.sync_detailed("1", client=reader), 200, SaleAnswer, claimed=1.0, waiting=1)

# The waiting room: user 2 waits behind user 1, who does not pay; a long
# poll wakes when user 2 is promoted.
expect("buy, voucher 8", buy(8, 1), 201, PurchaseAnswer, outcome="success")
expect("in line, voucher 8", buy(8, 2), 410, PurchaseAnswer, outcome="sold_out")
started = time.monotonic()
woken = expect("a long poll", show_purchase.sync_detailed("8", "2", client=reader, wait="30s"), 200, BuyerAnswer, state="bought", bought=True)
if time.monotonic() - started > 29:
    failures.append("the long poll ran out its wait instead of waking on the promotion")

expect("pay", pay.sync_detailed(order_id, client=full), 200, PaymentAnswer, outcome="paid", order_id=order_id)
expect("pay again", pay.sync_detailed(order_id, client=full), 409, PaymentAnswer, outcome="already_paid")
expect("pay, unknown", pay.sync_detailed("12345", client=full), 404, PaymentAnswer, outcome="unknown_order")
expect("pay, a read key", pay.sync_detailed(order_id, client=reader), 403, Problem, code="insufficient_scope")
expect("pay, a bad id", pay.sync_detailed("x", client=full), 400, Problem, code="invalid_id")

expect("ready", readyz.sync_detailed(client=nobody), 200, ReadyAnswer, ready=True)
live = healthz.sync_detailed(client=nobody)
print(("ok   " if live.status_code == 200 else "FAIL ") + f"healthz: {live.status_code} {live.content[:20]!r}")
if live.status_code != 200:
    failures.append("healthz")
document = document_route.sync_detailed(client=reader)
print(("ok   " if document.status_code == 200 else "FAIL ") + f"document: {document.status_code}")
if document.status_code != 200:
    failures.append("document")

print(f"{len(failures)} failure(s)")
sys.exit(1 if failures else 0)
