
use builtin;
use str;

set edit:completion:arg-completer[seckill] = {|@words|
    fn spaces {|n|
        builtin:repeat $n ' ' | str:join ''
    }
    fn cand {|text desc|
        edit:complex-candidate $text &display=$text' '(spaces (- 14 (wcswidth $text)))$desc
    }
    var command = 'seckill'
    for word $words[1..-1] {
        if (str:has-prefix $word '-') {
            break
        }
        set command = $command';'$word
    }
    var completions = [
        &'seckill'= {
            cand --redis-url 'Redis URL (redis://[:password@]host:port/[db])'
            cand --mysql-url 'MySQL URL (mysql://user:password@host:port/database) [default: mysql://seckill:***@127.0.0.1:13306/seckill]'
            cand --prefix 'Key prefix of every Redis key'
            cand --connect-timeout 'How long to wait for a server to accept a connection'
            cand --redis-password-file 'Read the Redis password from this file (one trailing newline is dropped), e.g. a systemd credential; the URL must then have none'
            cand --mysql-password-file 'Read the MySQL password from this file (one trailing newline is dropped), e.g. a systemd credential; the URL must then have none'
            cand -v 'More log output on stderr (-v debug, -vv trace); RUST_LOG overrides'
            cand --verbose 'More log output on stderr (-v debug, -vv trace); RUST_LOG overrides'
            cand -q 'Only errors on stderr'
            cand --quiet 'Only errors on stderr'
            cand -h 'Print help (see more with ''--help'')'
            cand --help 'Print help (see more with ''--help'')'
            cand -V 'Print version'
            cand --version 'Print version'
            cand init 'Create or upgrade the MySQL schema and check both servers'' versions'
            cand status 'One row per voucher: both stores side by side, in flight, dead letters, deadlines'
            cand voucher 'Add and list vouchers (MySQL, the source of truth)'
            cand preload 'Load vouchers from MySQL into the Redis gate and register them for workers'
            cand buy 'One admission attempt through lua/seckill.lua (exit code tells the outcome)'
            cand bench 'Load-test the admission script and report attempts/s and latency'
            cand token 'Admission tokens for vouchers that require them'
            cand worker 'Persist admitted orders to MySQL, cancel unpaid ones at their deadline (layers 2-5)'
            cand pending 'Show stream backlog, pending entries and dead letters; requeue dead letters'
            cand pay 'Mark a pending order paid (before its payment deadline)'
            cand order 'Look up orders'
            cand waitlist 'Show a voucher''s waitlist and how many released units it received'
            cand reconcile 'Compare Redis with MySQL per voucher, classify drift, repair it safely'
            cand generate 'Write shell completions and man pages (for packagers)'
            cand help 'Print this message or the help of the given subcommand(s)'
        }
        &'seckill;init'= {
            cand --format 'Output format'
            cand --redis-url 'Redis URL (redis://[:password@]host:port/[db])'
            cand --mysql-url 'MySQL URL (mysql://user:password@host:port/database) [default: mysql://seckill:***@127.0.0.1:13306/seckill]'
            cand --prefix 'Key prefix of every Redis key'
            cand --connect-timeout 'How long to wait for a server to accept a connection'
            cand --redis-password-file 'Read the Redis password from this file (one trailing newline is dropped), e.g. a systemd credential; the URL must then have none'
            cand --mysql-password-file 'Read the MySQL password from this file (one trailing newline is dropped), e.g. a systemd credential; the URL must then have none'
            cand -v 'More log output on stderr (-v debug, -vv trace); RUST_LOG overrides'
            cand --verbose 'More log output on stderr (-v debug, -vv trace); RUST_LOG overrides'
            cand -q 'Only errors on stderr'
            cand --quiet 'Only errors on stderr'
            cand -h 'Print help (see more with ''--help'')'
            cand --help 'Print help (see more with ''--help'')'
            cand -V 'Print version'
            cand --version 'Print version'
        }
        &'seckill;status'= {
            cand --voucher 'Only these vouchers (repeatable)'
            cand --watch 'Refresh every so often until Ctrl-C (in place on a terminal)'
            cand --format 'Output format'
            cand --redis-url 'Redis URL (redis://[:password@]host:port/[db])'
            cand --mysql-url 'MySQL URL (mysql://user:password@host:port/database) [default: mysql://seckill:***@127.0.0.1:13306/seckill]'
            cand --prefix 'Key prefix of every Redis key'
            cand --connect-timeout 'How long to wait for a server to accept a connection'
            cand --redis-password-file 'Read the Redis password from this file (one trailing newline is dropped), e.g. a systemd credential; the URL must then have none'
            cand --mysql-password-file 'Read the MySQL password from this file (one trailing newline is dropped), e.g. a systemd credential; the URL must then have none'
            cand -v 'More log output on stderr (-v debug, -vv trace); RUST_LOG overrides'
            cand --verbose 'More log output on stderr (-v debug, -vv trace); RUST_LOG overrides'
            cand -q 'Only errors on stderr'
            cand --quiet 'Only errors on stderr'
            cand -h 'Print help (see more with ''--help'')'
            cand --help 'Print help (see more with ''--help'')'
            cand -V 'Print version'
            cand --version 'Print version'
        }
        &'seckill;voucher'= {
            cand --redis-url 'Redis URL (redis://[:password@]host:port/[db])'
            cand --mysql-url 'MySQL URL (mysql://user:password@host:port/database) [default: mysql://seckill:***@127.0.0.1:13306/seckill]'
            cand --prefix 'Key prefix of every Redis key'
            cand --connect-timeout 'How long to wait for a server to accept a connection'
            cand --redis-password-file 'Read the Redis password from this file (one trailing newline is dropped), e.g. a systemd credential; the URL must then have none'
            cand --mysql-password-file 'Read the MySQL password from this file (one trailing newline is dropped), e.g. a systemd credential; the URL must then have none'
            cand -v 'More log output on stderr (-v debug, -vv trace); RUST_LOG overrides'
            cand --verbose 'More log output on stderr (-v debug, -vv trace); RUST_LOG overrides'
            cand -q 'Only errors on stderr'
            cand --quiet 'Only errors on stderr'
            cand -h 'Print help'
            cand --help 'Print help'
            cand -V 'Print version'
            cand --version 'Print version'
            cand add 'Add a voucher to MySQL (then `seckill preload` opens it at the gate)'
            cand update 'Change a voucher''s admission policy, in MySQL and at the gate at once'
            cand list 'List vouchers: MySQL stock and orders beside the Redis gate''s state'
            cand help 'Print this message or the help of the given subcommand(s)'
        }
        &'seckill;voucher;add'= {
            cand --id 'Voucher id (1..=9223372036854775807)'
            cand --stock 'Units for sale'
            cand --begin 'Sale opens: RFC 3339, `now`, or relative like `+10m`'
            cand --end 'Sale closes: RFC 3339, `now`, or relative like `+2h` [default: begin + 24h]'
            cand --pay-timeout 'Time a buyer has to pay before the unit is released'
            cand --title 'Title shown in listings'
            cand --user-rate 'At most N attempts per user in any one second at the gate (0: no limit)'
            cand --format 'Output format'
            cand --redis-url 'Redis URL (redis://[:password@]host:port/[db])'
            cand --mysql-url 'MySQL URL (mysql://user:password@host:port/database) [default: mysql://seckill:***@127.0.0.1:13306/seckill]'
            cand --prefix 'Key prefix of every Redis key'
            cand --connect-timeout 'How long to wait for a server to accept a connection'
            cand --redis-password-file 'Read the Redis password from this file (one trailing newline is dropped), e.g. a systemd credential; the URL must then have none'
            cand --mysql-password-file 'Read the MySQL password from this file (one trailing newline is dropped), e.g. a systemd credential; the URL must then have none'
            cand --require-token 'Admission needs a token issued for the user (`seckill token issue`)'
            cand -v 'More log output on stderr (-v debug, -vv trace); RUST_LOG overrides'
            cand --verbose 'More log output on stderr (-v debug, -vv trace); RUST_LOG overrides'
            cand -q 'Only errors on stderr'
            cand --quiet 'Only errors on stderr'
            cand -h 'Print help (see more with ''--help'')'
            cand --help 'Print help (see more with ''--help'')'
            cand -V 'Print version'
            cand --version 'Print version'
        }
        &'seckill;voucher;update'= {
            cand --id 'Voucher id'
            cand --user-rate 'At most N attempts per user in any one second at the gate (0: no limit)'
            cand --format 'Output format'
            cand --redis-url 'Redis URL (redis://[:password@]host:port/[db])'
            cand --mysql-url 'MySQL URL (mysql://user:password@host:port/database) [default: mysql://seckill:***@127.0.0.1:13306/seckill]'
            cand --prefix 'Key prefix of every Redis key'
            cand --connect-timeout 'How long to wait for a server to accept a connection'
            cand --redis-password-file 'Read the Redis password from this file (one trailing newline is dropped), e.g. a systemd credential; the URL must then have none'
            cand --mysql-password-file 'Read the MySQL password from this file (one trailing newline is dropped), e.g. a systemd credential; the URL must then have none'
            cand --require-token 'Admission needs a token issued for the user'
            cand --no-require-token 'Admission needs no token'
            cand -v 'More log output on stderr (-v debug, -vv trace); RUST_LOG overrides'
            cand --verbose 'More log output on stderr (-v debug, -vv trace); RUST_LOG overrides'
            cand -q 'Only errors on stderr'
            cand --quiet 'Only errors on stderr'
            cand -h 'Print help (see more with ''--help'')'
            cand --help 'Print help (see more with ''--help'')'
            cand -V 'Print version'
            cand --version 'Print version'
        }
        &'seckill;voucher;list'= {
            cand --voucher 'Only these vouchers (repeatable)'
            cand --format 'Output format'
            cand --redis-url 'Redis URL (redis://[:password@]host:port/[db])'
            cand --mysql-url 'MySQL URL (mysql://user:password@host:port/database) [default: mysql://seckill:***@127.0.0.1:13306/seckill]'
            cand --prefix 'Key prefix of every Redis key'
            cand --connect-timeout 'How long to wait for a server to accept a connection'
            cand --redis-password-file 'Read the Redis password from this file (one trailing newline is dropped), e.g. a systemd credential; the URL must then have none'
            cand --mysql-password-file 'Read the MySQL password from this file (one trailing newline is dropped), e.g. a systemd credential; the URL must then have none'
            cand -v 'More log output on stderr (-v debug, -vv trace); RUST_LOG overrides'
            cand --verbose 'More log output on stderr (-v debug, -vv trace); RUST_LOG overrides'
            cand -q 'Only errors on stderr'
            cand --quiet 'Only errors on stderr'
            cand -h 'Print help (see more with ''--help'')'
            cand --help 'Print help (see more with ''--help'')'
            cand -V 'Print version'
            cand --version 'Print version'
        }
        &'seckill;voucher;help'= {
            cand add 'Add a voucher to MySQL (then `seckill preload` opens it at the gate)'
            cand update 'Change a voucher''s admission policy, in MySQL and at the gate at once'
            cand list 'List vouchers: MySQL stock and orders beside the Redis gate''s state'
            cand help 'Print this message or the help of the given subcommand(s)'
        }
        &'seckill;voucher;help;add'= {
        }
        &'seckill;voucher;help;update'= {
        }
        &'seckill;voucher;help;list'= {
        }
        &'seckill;voucher;help;help'= {
        }
        &'seckill;preload'= {
            cand --voucher 'The voucher to load'
            cand --format 'Output format'
            cand --redis-url 'Redis URL (redis://[:password@]host:port/[db])'
            cand --mysql-url 'MySQL URL (mysql://user:password@host:port/database) [default: mysql://seckill:***@127.0.0.1:13306/seckill]'
            cand --prefix 'Key prefix of every Redis key'
            cand --connect-timeout 'How long to wait for a server to accept a connection'
            cand --redis-password-file 'Read the Redis password from this file (one trailing newline is dropped), e.g. a systemd credential; the URL must then have none'
            cand --mysql-password-file 'Read the MySQL password from this file (one trailing newline is dropped), e.g. a systemd credential; the URL must then have none'
            cand --all 'Load every voucher in MySQL'
            cand --force 'Load even while orders are in flight (this can re-admit sold units; prefer `seckill reconcile`)'
            cand -v 'More log output on stderr (-v debug, -vv trace); RUST_LOG overrides'
            cand --verbose 'More log output on stderr (-v debug, -vv trace); RUST_LOG overrides'
            cand -q 'Only errors on stderr'
            cand --quiet 'Only errors on stderr'
            cand -h 'Print help (see more with ''--help'')'
            cand --help 'Print help (see more with ''--help'')'
            cand -V 'Print version'
            cand --version 'Print version'
        }
        &'seckill;buy'= {
            cand --voucher 'Voucher id'
            cand --user 'User id'
            cand --token 'The user''s admission token (`seckill token issue`), for a voucher that requires one'
            cand --wait-replicas 'After a success, wait until N replicas of the voucher''s master have it (a failover to one of them then keeps it) [default: no wait]'
            cand --wait-timeout 'The longest --wait-replicas waits before giving up (the admission stands either way)'
            cand --node-id 'Snowflake node id (0..=1023), leased from Redis: refused while another live process holds it [default: a free one, leased]'
            cand --format 'Output format'
            cand --redis-url 'Redis URL (redis://[:password@]host:port/[db])'
            cand --mysql-url 'MySQL URL (mysql://user:password@host:port/database) [default: mysql://seckill:***@127.0.0.1:13306/seckill]'
            cand --prefix 'Key prefix of every Redis key'
            cand --connect-timeout 'How long to wait for a server to accept a connection'
            cand --redis-password-file 'Read the Redis password from this file (one trailing newline is dropped), e.g. a systemd credential; the URL must then have none'
            cand --mysql-password-file 'Read the MySQL password from this file (one trailing newline is dropped), e.g. a systemd credential; the URL must then have none'
            cand -v 'More log output on stderr (-v debug, -vv trace); RUST_LOG overrides'
            cand --verbose 'More log output on stderr (-v debug, -vv trace); RUST_LOG overrides'
            cand -q 'Only errors on stderr'
            cand --quiet 'Only errors on stderr'
            cand -h 'Print help (see more with ''--help'')'
            cand --help 'Print help (see more with ''--help'')'
            cand -V 'Print version'
            cand --version 'Print version'
        }
        &'seckill;bench'= {
            cand --voucher 'Voucher id (preloaded)'
            cand --users 'Distinct users; attempt i is made by user (user-offset + i mod users + 1)'
            cand --user-offset 'First user id is user-offset + 1'
            cand --attempts 'Admission attempts in all'
            cand --concurrency 'Attempts in flight at once'
            cand --connections 'Redis connections the attempts are spread over'
            cand --wait-replicas 'After a success, wait until N replicas of the voucher''s master have it (a failover to one of them then keeps it) [default: no wait]'
            cand --wait-timeout 'The longest --wait-replicas waits before giving up (the admission stands either way)'
            cand --node-id 'Snowflake node id (0..=1023), leased from Redis: refused while another live process holds it [default: a free one, leased]'
            cand --format 'Output format'
            cand --redis-url 'Redis URL (redis://[:password@]host:port/[db])'
            cand --mysql-url 'MySQL URL (mysql://user:password@host:port/database) [default: mysql://seckill:***@127.0.0.1:13306/seckill]'
            cand --prefix 'Key prefix of every Redis key'
            cand --connect-timeout 'How long to wait for a server to accept a connection'
            cand --redis-password-file 'Read the Redis password from this file (one trailing newline is dropped), e.g. a systemd credential; the URL must then have none'
            cand --mysql-password-file 'Read the MySQL password from this file (one trailing newline is dropped), e.g. a systemd credential; the URL must then have none'
            cand --tokens 'Issue an admission token to every user first (timed apart from the attempts) and attempt with it'
            cand -v 'More log output on stderr (-v debug, -vv trace); RUST_LOG overrides'
            cand --verbose 'More log output on stderr (-v debug, -vv trace); RUST_LOG overrides'
            cand -q 'Only errors on stderr'
            cand --quiet 'Only errors on stderr'
            cand -h 'Print help (see more with ''--help'')'
            cand --help 'Print help (see more with ''--help'')'
            cand -V 'Print version'
            cand --version 'Print version'
        }
        &'seckill;token'= {
            cand --redis-url 'Redis URL (redis://[:password@]host:port/[db])'
            cand --mysql-url 'MySQL URL (mysql://user:password@host:port/database) [default: mysql://seckill:***@127.0.0.1:13306/seckill]'
            cand --prefix 'Key prefix of every Redis key'
            cand --connect-timeout 'How long to wait for a server to accept a connection'
            cand --redis-password-file 'Read the Redis password from this file (one trailing newline is dropped), e.g. a systemd credential; the URL must then have none'
            cand --mysql-password-file 'Read the MySQL password from this file (one trailing newline is dropped), e.g. a systemd credential; the URL must then have none'
            cand -v 'More log output on stderr (-v debug, -vv trace); RUST_LOG overrides'
            cand --verbose 'More log output on stderr (-v debug, -vv trace); RUST_LOG overrides'
            cand -q 'Only errors on stderr'
            cand --quiet 'Only errors on stderr'
            cand -h 'Print help'
            cand --help 'Print help'
            cand -V 'Print version'
            cand --version 'Print version'
            cand issue 'Issue a user''s admission token for a voucher that requires one'
            cand help 'Print this message or the help of the given subcommand(s)'
        }
        &'seckill;token;issue'= {
            cand --voucher 'Voucher id'
            cand --user 'User id'
            cand --ttl 'How long the token stays valid (at most 24h); issuing again replaces it'
            cand --format 'Output format'
            cand --redis-url 'Redis URL (redis://[:password@]host:port/[db])'
            cand --mysql-url 'MySQL URL (mysql://user:password@host:port/database) [default: mysql://seckill:***@127.0.0.1:13306/seckill]'
            cand --prefix 'Key prefix of every Redis key'
            cand --connect-timeout 'How long to wait for a server to accept a connection'
            cand --redis-password-file 'Read the Redis password from this file (one trailing newline is dropped), e.g. a systemd credential; the URL must then have none'
            cand --mysql-password-file 'Read the MySQL password from this file (one trailing newline is dropped), e.g. a systemd credential; the URL must then have none'
            cand -v 'More log output on stderr (-v debug, -vv trace); RUST_LOG overrides'
            cand --verbose 'More log output on stderr (-v debug, -vv trace); RUST_LOG overrides'
            cand -q 'Only errors on stderr'
            cand --quiet 'Only errors on stderr'
            cand -h 'Print help (see more with ''--help'')'
            cand --help 'Print help (see more with ''--help'')'
            cand -V 'Print version'
            cand --version 'Print version'
        }
        &'seckill;token;help'= {
            cand issue 'Issue a user''s admission token for a voucher that requires one'
            cand help 'Print this message or the help of the given subcommand(s)'
        }
        &'seckill;token;help;issue'= {
        }
        &'seckill;token;help;help'= {
        }
        &'seckill;worker'= {
            cand --consumer 'Consumer name in the group, stable per instance [default: host-pid]'
            cand --batch 'Entries read and persisted per batch (one MySQL transaction)'
            cand --block 'Longest wait of one blocking read for new entries'
            cand --claim-idle 'Reclaim entries another consumer has left pending this long'
            cand --max-deliveries 'Dead-letter a message that cannot be persisted after this many deliveries'
            cand --lock-lease 'Lease of the per-(user, voucher) locks, renewed while a batch runs'
            cand --keep 'Trim acknowledged stream entries older than this'
            cand --lanes 'Batches in hand at once (one reads and locks while another commits)'
            cand --deadline-lease 'A claimed payment deadline comes back after this long if its claimer died'
            cand --sweep-every 'How often MySQL is swept for pending orders whose deadline Redis lost'
            cand --sweep-grace 'How far past its deadline a pending order must be for the sweep to cancel it'
            cand --gate-check 'How often the gates are checked for writes Redis lost that MySQL holds (then paused, rebuilt from MySQL and reopened); 0s: never'
            cand --node-id 'Snowflake node id (0..=1023), leased from Redis: refused while another live process holds it [default: a free one, leased]'
            cand --metrics-addr 'Serve Prometheus metrics at http://ADDR/metrics (e.g. 127.0.0.1:9464)'
            cand --format 'Output format'
            cand --redis-url 'Redis URL (redis://[:password@]host:port/[db])'
            cand --mysql-url 'MySQL URL (mysql://user:password@host:port/database) [default: mysql://seckill:***@127.0.0.1:13306/seckill]'
            cand --prefix 'Key prefix of every Redis key'
            cand --connect-timeout 'How long to wait for a server to accept a connection'
            cand --redis-password-file 'Read the Redis password from this file (one trailing newline is dropped), e.g. a systemd credential; the URL must then have none'
            cand --mysql-password-file 'Read the MySQL password from this file (one trailing newline is dropped), e.g. a systemd credential; the URL must then have none'
            cand --until-idle 'Exit 0 once no voucher has undelivered or pending entries (for cron)'
            cand -v 'More log output on stderr (-v debug, -vv trace); RUST_LOG overrides'
            cand --verbose 'More log output on stderr (-v debug, -vv trace); RUST_LOG overrides'
            cand -q 'Only errors on stderr'
            cand --quiet 'Only errors on stderr'
            cand -h 'Print help (see more with ''--help'')'
            cand --help 'Print help (see more with ''--help'')'
            cand -V 'Print version'
            cand --version 'Print version'
        }
        &'seckill;pending'= {
            cand --voucher 'Show this voucher''s pending entries and dead letters'
            cand --limit 'How many pending entries and dead letters to list'
            cand --entry 'A dead-letter id to requeue (repeatable)'
            cand --format 'Output format'
            cand --redis-url 'Redis URL (redis://[:password@]host:port/[db])'
            cand --mysql-url 'MySQL URL (mysql://user:password@host:port/database) [default: mysql://seckill:***@127.0.0.1:13306/seckill]'
            cand --prefix 'Key prefix of every Redis key'
            cand --connect-timeout 'How long to wait for a server to accept a connection'
            cand --redis-password-file 'Read the Redis password from this file (one trailing newline is dropped), e.g. a systemd credential; the URL must then have none'
            cand --mysql-password-file 'Read the MySQL password from this file (one trailing newline is dropped), e.g. a systemd credential; the URL must then have none'
            cand --requeue 'Move the voucher''s dead letters back into its order stream (after fixing their cause); with --entry only those'
            cand -y 'Do not ask for confirmation (for cron and scripts)'
            cand --yes 'Do not ask for confirmation (for cron and scripts)'
            cand -v 'More log output on stderr (-v debug, -vv trace); RUST_LOG overrides'
            cand --verbose 'More log output on stderr (-v debug, -vv trace); RUST_LOG overrides'
            cand -q 'Only errors on stderr'
            cand --quiet 'Only errors on stderr'
            cand -h 'Print help (see more with ''--help'')'
            cand --help 'Print help (see more with ''--help'')'
            cand -V 'Print version'
            cand --version 'Print version'
        }
        &'seckill;pay'= {
            cand --order 'Order id'
            cand --format 'Output format'
            cand --redis-url 'Redis URL (redis://[:password@]host:port/[db])'
            cand --mysql-url 'MySQL URL (mysql://user:password@host:port/database) [default: mysql://seckill:***@127.0.0.1:13306/seckill]'
            cand --prefix 'Key prefix of every Redis key'
            cand --connect-timeout 'How long to wait for a server to accept a connection'
            cand --redis-password-file 'Read the Redis password from this file (one trailing newline is dropped), e.g. a systemd credential; the URL must then have none'
            cand --mysql-password-file 'Read the MySQL password from this file (one trailing newline is dropped), e.g. a systemd credential; the URL must then have none'
            cand -v 'More log output on stderr (-v debug, -vv trace); RUST_LOG overrides'
            cand --verbose 'More log output on stderr (-v debug, -vv trace); RUST_LOG overrides'
            cand -q 'Only errors on stderr'
            cand --quiet 'Only errors on stderr'
            cand -h 'Print help (see more with ''--help'')'
            cand --help 'Print help (see more with ''--help'')'
            cand -V 'Print version'
            cand --version 'Print version'
        }
        &'seckill;order'= {
            cand --redis-url 'Redis URL (redis://[:password@]host:port/[db])'
            cand --mysql-url 'MySQL URL (mysql://user:password@host:port/database) [default: mysql://seckill:***@127.0.0.1:13306/seckill]'
            cand --prefix 'Key prefix of every Redis key'
            cand --connect-timeout 'How long to wait for a server to accept a connection'
            cand --redis-password-file 'Read the Redis password from this file (one trailing newline is dropped), e.g. a systemd credential; the URL must then have none'
            cand --mysql-password-file 'Read the MySQL password from this file (one trailing newline is dropped), e.g. a systemd credential; the URL must then have none'
            cand -v 'More log output on stderr (-v debug, -vv trace); RUST_LOG overrides'
            cand --verbose 'More log output on stderr (-v debug, -vv trace); RUST_LOG overrides'
            cand -q 'Only errors on stderr'
            cand --quiet 'Only errors on stderr'
            cand -h 'Print help'
            cand --help 'Print help'
            cand -V 'Print version'
            cand --version 'Print version'
            cand show 'One order: status, user, voucher, created, payment deadline, paid/cancelled time'
            cand help 'Print this message or the help of the given subcommand(s)'
        }
        &'seckill;order;show'= {
            cand --format 'Output format'
            cand --redis-url 'Redis URL (redis://[:password@]host:port/[db])'
            cand --mysql-url 'MySQL URL (mysql://user:password@host:port/database) [default: mysql://seckill:***@127.0.0.1:13306/seckill]'
            cand --prefix 'Key prefix of every Redis key'
            cand --connect-timeout 'How long to wait for a server to accept a connection'
            cand --redis-password-file 'Read the Redis password from this file (one trailing newline is dropped), e.g. a systemd credential; the URL must then have none'
            cand --mysql-password-file 'Read the MySQL password from this file (one trailing newline is dropped), e.g. a systemd credential; the URL must then have none'
            cand -v 'More log output on stderr (-v debug, -vv trace); RUST_LOG overrides'
            cand --verbose 'More log output on stderr (-v debug, -vv trace); RUST_LOG overrides'
            cand -q 'Only errors on stderr'
            cand --quiet 'Only errors on stderr'
            cand -h 'Print help (see more with ''--help'')'
            cand --help 'Print help (see more with ''--help'')'
            cand -V 'Print version'
            cand --version 'Print version'
        }
        &'seckill;order;help'= {
            cand show 'One order: status, user, voucher, created, payment deadline, paid/cancelled time'
            cand help 'Print this message or the help of the given subcommand(s)'
        }
        &'seckill;order;help;show'= {
        }
        &'seckill;order;help;help'= {
        }
        &'seckill;waitlist'= {
            cand --voucher 'Voucher id'
            cand --limit 'How many users from the head of the line to show'
            cand --format 'Output format'
            cand --redis-url 'Redis URL (redis://[:password@]host:port/[db])'
            cand --mysql-url 'MySQL URL (mysql://user:password@host:port/database) [default: mysql://seckill:***@127.0.0.1:13306/seckill]'
            cand --prefix 'Key prefix of every Redis key'
            cand --connect-timeout 'How long to wait for a server to accept a connection'
            cand --redis-password-file 'Read the Redis password from this file (one trailing newline is dropped), e.g. a systemd credential; the URL must then have none'
            cand --mysql-password-file 'Read the MySQL password from this file (one trailing newline is dropped), e.g. a systemd credential; the URL must then have none'
            cand -v 'More log output on stderr (-v debug, -vv trace); RUST_LOG overrides'
            cand --verbose 'More log output on stderr (-v debug, -vv trace); RUST_LOG overrides'
            cand -q 'Only errors on stderr'
            cand --quiet 'Only errors on stderr'
            cand -h 'Print help (see more with ''--help'')'
            cand --help 'Print help (see more with ''--help'')'
            cand -V 'Print version'
            cand --version 'Print version'
        }
        &'seckill;reconcile'= {
            cand --voucher 'Only these vouchers (repeatable) [default: every voucher registered at the gate or holding orders in MySQL]'
            cand --attempts 'How often to re-read a voucher that keeps moving before calling it busy'
            cand --settle 'Cancellations and new orders younger than this are still being handled by a worker, not drift (keep it above the worker''s --deadline-lease)'
            cand --node-id 'Snowflake node id (0..=1023), leased from Redis: refused while another live process holds it [default: a free one, leased]'
            cand --format 'Output format'
            cand --redis-url 'Redis URL (redis://[:password@]host:port/[db])'
            cand --mysql-url 'MySQL URL (mysql://user:password@host:port/database) [default: mysql://seckill:***@127.0.0.1:13306/seckill]'
            cand --prefix 'Key prefix of every Redis key'
            cand --connect-timeout 'How long to wait for a server to accept a connection'
            cand --redis-password-file 'Read the Redis password from this file (one trailing newline is dropped), e.g. a systemd credential; the URL must then have none'
            cand --mysql-password-file 'Read the MySQL password from this file (one trailing newline is dropped), e.g. a systemd credential; the URL must then have none'
            cand --dry-run 'Report what would be repaired; change nothing'
            cand --fix-mysql 'Also repair MySQL when its stock + active orders != total'
            cand -y 'Do not ask for confirmation (for cron and scripts)'
            cand --yes 'Do not ask for confirmation (for cron and scripts)'
            cand -v 'More log output on stderr (-v debug, -vv trace); RUST_LOG overrides'
            cand --verbose 'More log output on stderr (-v debug, -vv trace); RUST_LOG overrides'
            cand -q 'Only errors on stderr'
            cand --quiet 'Only errors on stderr'
            cand -h 'Print help (see more with ''--help'')'
            cand --help 'Print help (see more with ''--help'')'
            cand -V 'Print version'
            cand --version 'Print version'
        }
        &'seckill;generate'= {
            cand --out-dir 'Directory that receives completions/ and man/'
            cand --redis-url 'Redis URL (redis://[:password@]host:port/[db])'
            cand --mysql-url 'MySQL URL (mysql://user:password@host:port/database) [default: mysql://seckill:***@127.0.0.1:13306/seckill]'
            cand --prefix 'Key prefix of every Redis key'
            cand --connect-timeout 'How long to wait for a server to accept a connection'
            cand --redis-password-file 'Read the Redis password from this file (one trailing newline is dropped), e.g. a systemd credential; the URL must then have none'
            cand --mysql-password-file 'Read the MySQL password from this file (one trailing newline is dropped), e.g. a systemd credential; the URL must then have none'
            cand -v 'More log output on stderr (-v debug, -vv trace); RUST_LOG overrides'
            cand --verbose 'More log output on stderr (-v debug, -vv trace); RUST_LOG overrides'
            cand -q 'Only errors on stderr'
            cand --quiet 'Only errors on stderr'
            cand -h 'Print help'
            cand --help 'Print help'
            cand -V 'Print version'
            cand --version 'Print version'
        }
        &'seckill;help'= {
            cand init 'Create or upgrade the MySQL schema and check both servers'' versions'
            cand status 'One row per voucher: both stores side by side, in flight, dead letters, deadlines'
            cand voucher 'Add and list vouchers (MySQL, the source of truth)'
            cand preload 'Load vouchers from MySQL into the Redis gate and register them for workers'
            cand buy 'One admission attempt through lua/seckill.lua (exit code tells the outcome)'
            cand bench 'Load-test the admission script and report attempts/s and latency'
            cand token 'Admission tokens for vouchers that require them'
            cand worker 'Persist admitted orders to MySQL, cancel unpaid ones at their deadline (layers 2-5)'
            cand pending 'Show stream backlog, pending entries and dead letters; requeue dead letters'
            cand pay 'Mark a pending order paid (before its payment deadline)'
            cand order 'Look up orders'
            cand waitlist 'Show a voucher''s waitlist and how many released units it received'
            cand reconcile 'Compare Redis with MySQL per voucher, classify drift, repair it safely'
            cand generate 'Write shell completions and man pages (for packagers)'
            cand help 'Print this message or the help of the given subcommand(s)'
        }
        &'seckill;help;init'= {
        }
        &'seckill;help;status'= {
        }
        &'seckill;help;voucher'= {
            cand add 'Add a voucher to MySQL (then `seckill preload` opens it at the gate)'
            cand update 'Change a voucher''s admission policy, in MySQL and at the gate at once'
            cand list 'List vouchers: MySQL stock and orders beside the Redis gate''s state'
        }
        &'seckill;help;voucher;add'= {
        }
        &'seckill;help;voucher;update'= {
        }
        &'seckill;help;voucher;list'= {
        }
        &'seckill;help;preload'= {
        }
        &'seckill;help;buy'= {
        }
        &'seckill;help;bench'= {
        }
        &'seckill;help;token'= {
            cand issue 'Issue a user''s admission token for a voucher that requires one'
        }
        &'seckill;help;token;issue'= {
        }
        &'seckill;help;worker'= {
        }
        &'seckill;help;pending'= {
        }
        &'seckill;help;pay'= {
        }
        &'seckill;help;order'= {
            cand show 'One order: status, user, voucher, created, payment deadline, paid/cancelled time'
        }
        &'seckill;help;order;show'= {
        }
        &'seckill;help;waitlist'= {
        }
        &'seckill;help;reconcile'= {
        }
        &'seckill;help;generate'= {
        }
        &'seckill;help;help'= {
        }
    ]
    $completions[$command]
}
