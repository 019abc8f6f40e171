#!/usr/bin/env python3
"""One voucher with many orders, as a consistent sale leaves it, for the
benchmarks that need millions of rows (bulk loads, not a sale: a sale of
ten million would take the benchmark's whole time).

  big_voucher.py sql   VOUCHER START END   -> SQL on stdout
  big_voucher.py redis VOUCHER START END PREFIX -> Redis protocol on stdout

Orders START..END-1 (the voucher row is written when START is 0, and its
counters and totals are set to END either way): order id 10^12 + i, user
i + 1, one unit each, even i pending and odd i paid, all created two minutes
ago with an hour to pay (ago from BIG_VOUCHER_NOW, Unix seconds, if set). The gate: every user a buyer, every pending order's
deadline, stock 0 (sold out).
"""
import os
import sys
import time

ROWS = 10_000  # per INSERT


def sql(v, start, end, now):
    if start == 0:
        print(
            "INSERT INTO seckill_voucher (voucher_id, title, total_stock, stock, begin_time, end_time,"
            f" pay_timeout_ms) VALUES ({v},'big',{end},0,FROM_UNIXTIME({now - 60}),"
            f"FROM_UNIXTIME({now + 3600}),3600000);"
        )
    for first in range(start, end, ROWS):
        rows = ",".join(
            f"({10**12 + i},{i + 1},{v},{i % 2},FROM_UNIXTIME({now - 120}))"
            for i in range(first, min(end, first + ROWS))
        )
        print(f"INSERT INTO seckill_order (id, user_id, voucher_id, status, create_time) VALUES {rows};")
    paid = end // 2
    print(
        f"UPDATE seckill_voucher SET total_stock = {end}, orders_total = {end}, units_total = {end},"
        f" orders_paid = {paid}, units_paid = {paid} WHERE voucher_id = {v};"
    )


def redis(v, start, end, prefix, now):
    out = sys.stdout

    def cmd(*args):
        parts = [f"*{len(args)}\r\n"]
        for a in args:
            a = str(a)
            parts.append(f"${len(a.encode())}\r\n{a}\r\n")
        out.write("".join(parts))

    k = f"{prefix}:{{{v}}}"
    cmd("HSET", f"{k}:meta", "total", end, "begin_ms", (now - 60) * 1000,
        "end_ms", (now + 3600) * 1000, "pay_timeout_ms", 3600000)
    cmd("SET", f"{k}:stock", 0)
    deadline = (now - 120) * 1000 + 3600000
    for first in range(start, end, 1000):
        last = min(end, first + 1000)
        cmd("SADD", f"{k}:buyers", *range(first + 1, last + 1))
        cmd("ZADD", f"{k}:timeouts",
            *[x for i in range(first, last) if i % 2 == 0 for x in (deadline, 10**12 + i)])
    cmd("SADD", f"{prefix}:vouchers", v)


def main():
    what, v, start, end = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
    # One clock for every call of a run, so rows loaded in steps agree.
    now = int(os.environ.get("BIG_VOUCHER_NOW", time.time()))
    if what == "sql":
        sql(v, start, end, now)
    else:
        redis(v, start, end, sys.argv[5], now)


main()
