#!/usr/bin/env python3
"""Vouchers and orders as a consistent sale leaves them, bulk-loaded for the
benchmarks that need millions of rows (a sale of ten million would take the
benchmark's whole time).

  bench_data.py many-sql   N                -> SQL on stdout
  bench_data.py many-redis N PREFIX         -> Redis protocol on stdout
  bench_data.py many-streams N PREFIX       -> Redis protocol on stdout
  bench_data.py big-sql    V START END      -> SQL on stdout
  bench_data.py big-redis  V START END PREFIX -> Redis protocol on stdout
  bench_data.py digest     ID...            -> the set digest of the ids

many: vouchers 1..N of 10 units, each with 5 pending orders (id v*10+u,
users 1..5) and a gate that matches; many-streams adds to each the worker's
group and a stream entry for its first order.

big: voucher V's orders START..END-1 (the voucher row is written when START
is 0; its totals, counters and digests are set for 0..END either way):
order id 10^12 + i, user i + 1, one unit each, even i pending and odd i
paid, created two minutes ago with an hour to pay. The gate: every user a
buyer, every pending order's deadline, stock 0 (sold out).

Times count from BIG_VOUCHER_NOW (Unix seconds) if set, so steps agree.
The digests are those of src/support/set_digest.rs (its tests hold this
copy to it through the `digest` command: a generator written in Python
cannot call the library).
"""
import hashlib
import os
import sys
import time

ROWS = 10_000  # per INSERT
MODULUS = 1 << 52
NOW = int(os.environ.get("BIG_VOUCHER_NOW", time.time()))


def digest(ids):
    d = 0
    for i in ids:
        d += int(hashlib.sha1(str(i).encode()).hexdigest()[:13], 16)
    return d % MODULUS


def resp(*args):
    parts = [f"*{len(args)}\r\n"]
    for a in args:
        a = str(a)
        parts.append(f"${len(a.encode())}\r\n{a}\r\n")
    sys.stdout.write("".join(parts))


def many_sql(n):
    users = digest(range(1, 6))
    for start in range(1, n + 1, 2000):
        ids = range(start, min(n, start + 1999) + 1)
        print("INSERT INTO seckill_voucher (voucher_id, title, total_stock, stock, begin_time, end_time,"
              " pay_timeout_ms, orders_total, units_total, users_digest, pending_digest) VALUES "
              + ",".join(f"({v},'bench',10,5,FROM_UNIXTIME({NOW - 60}),FROM_UNIXTIME({NOW + 3600}),"
                         f"3600000,5,5,{users},{digest(v * 10 + u for u in range(1, 6))})" for v in ids)
              + ";")
        print("INSERT INTO seckill_order (id, user_id, voucher_id, status, create_time) VALUES "
              + ",".join(f"({v * 10 + u},{u},{v},0,FROM_UNIXTIME({NOW - 120}))"
                         for v in ids for u in range(1, 6)) + ";")


def many_redis(n, prefix):
    users = digest(range(1, 6))
    deadline = (NOW - 120) * 1000 + 3600000
    for v in range(1, n + 1):
        k = f"{prefix}:{{{v}}}"
        orders = [v * 10 + u for u in range(1, 6)]
        resp("HSET", f"{k}:meta", "total", 10, "begin_ms", (NOW - 60) * 1000, "end_ms", (NOW + 3600) * 1000,
             "pay_timeout_ms", 3600000, "buyers_digest", users, "timeouts_digest", digest(orders))
        resp("SET", f"{k}:stock", 5)
        resp("SADD", f"{k}:buyers", 1, 2, 3, 4, 5)
        resp("ZADD", f"{k}:timeouts", *[x for o in orders for x in (deadline, o)])
        resp("SADD", f"{prefix}:vouchers", v)


def big_sql(v, start, end):
    if start == 0:
        print("INSERT INTO seckill_voucher (voucher_id, title, total_stock, stock, begin_time, end_time,"
              f" pay_timeout_ms) VALUES ({v},'big',{end},0,FROM_UNIXTIME({NOW - 60}),"
              f"FROM_UNIXTIME({NOW + 3600}),3600000);")
    for first in range(start, end, ROWS):
        rows = ",".join(f"({10**12 + i},{i + 1},{v},{i % 2},FROM_UNIXTIME({NOW - 120}))"
                        for i in range(first, min(end, first + ROWS)))
        print(f"INSERT INTO seckill_order (id, user_id, voucher_id, status, create_time) VALUES {rows};")
    paid = end // 2
    print(f"UPDATE seckill_voucher SET total_stock = {end}, orders_total = {end}, units_total = {end},"
          f" orders_paid = {paid}, units_paid = {paid}, users_digest = {digest(range(1, end + 1))},"
          f" pending_digest = {digest(10**12 + i for i in range(0, end, 2))} WHERE voucher_id = {v};")


def big_redis(v, start, end, prefix):
    k = f"{prefix}:{{{v}}}"
    resp("HSET", f"{k}:meta", "total", end, "begin_ms", (NOW - 60) * 1000, "end_ms", (NOW + 3600) * 1000,
         "pay_timeout_ms", 3600000, "buyers_digest", digest(range(1, end + 1)),
         "timeouts_digest", digest(10**12 + i for i in range(0, end, 2)))
    resp("SET", f"{k}:stock", 0)
    deadline = (NOW - 120) * 1000 + 3600000
    for first in range(start, end, 1000):
        last = min(end, first + 1000)
        resp("SADD", f"{k}:buyers", *range(first + 1, last + 1))
        resp("ZADD", f"{k}:timeouts", *[x for i in range(first, last) if i % 2 == 0 for x in (deadline, 10**12 + i)])
    resp("SADD", f"{prefix}:vouchers", v)


def many_streams(n, prefix):
    """The worker's group and one entry on each of the many vouchers'
    order streams, for an order MySQL holds (a worker finds it stored and
    acknowledges it)."""
    for v in range(1, n + 1):
        k = f"{prefix}:{{{v}}}:orders"
        resp("XGROUP", "CREATE", k, "seckill-worker", "0", "MKSTREAM")
        resp("XADD", k, "*", "user", 1, "order", v * 10 + 1, "quantity", 1)


def main():
    what, args = sys.argv[1], sys.argv[2:]
    if what == "many-sql":
        many_sql(int(args[0]))
    elif what == "many-redis":
        many_redis(int(args[0]), args[1])
    elif what == "many-streams":
        many_streams(int(args[0]), args[1])
    elif what == "big-sql":
        big_sql(int(args[0]), int(args[1]), int(args[2]))
    elif what == "big-redis":
        big_redis(int(args[0]), int(args[1]), int(args[2]), args[3])
    elif what == "digest":
        print(digest(int(a) for a in args))
    else:
        sys.exit(f"bench_data.py: unknown {what!r}")


main()
