
using namespace System.Management.Automation
using namespace System.Management.Automation.Language

Register-ArgumentCompleter -Native -CommandName 'seckill' -ScriptBlock {
    param($wordToComplete, $commandAst, $cursorPosition)

    $commandElements = $commandAst.CommandElements
    $command = @(
        'seckill'
        for ($i = 1; $i -lt $commandElements.Count; $i++) {
            $element = $commandElements[$i]
            if ($element -isnot [StringConstantExpressionAst] -or
                $element.StringConstantType -ne [StringConstantType]::BareWord -or
                $element.Value.StartsWith('-') -or
                $element.Value -eq $wordToComplete) {
                break
        }
        $element.Value
    }) -join ';'

    $completions = @(switch ($command) {
        'seckill' {
            [CompletionResult]::new('--redis-url', '--redis-url', [CompletionResultType]::ParameterName, 'Redis URL (redis://[:password@]host:port/[db])')
            [CompletionResult]::new('--mysql-url', '--mysql-url', [CompletionResultType]::ParameterName, 'MySQL URL (mysql://user:password@host:port/database) [default: mysql://seckill:***@127.0.0.1:13306/seckill]')
            [CompletionResult]::new('--prefix', '--prefix', [CompletionResultType]::ParameterName, 'Key prefix of every Redis key')
            [CompletionResult]::new('--connect-timeout', '--connect-timeout', [CompletionResultType]::ParameterName, 'How long to wait for a server to accept a connection')
            [CompletionResult]::new('--redis-password-file', '--redis-password-file', [CompletionResultType]::ParameterName, 'Read the Redis password from this file (one trailing newline is dropped), e.g. a systemd credential; the URL must then have none')
            [CompletionResult]::new('--mysql-password-file', '--mysql-password-file', [CompletionResultType]::ParameterName, 'Read the MySQL password from this file (one trailing newline is dropped), e.g. a systemd credential; the URL must then have none')
            [CompletionResult]::new('--redis-ca-cert', '--redis-ca-cert', [CompletionResultType]::ParameterName, 'CA certificate (PEM) to trust for rediss:// URLs instead of the system''s roots')
            [CompletionResult]::new('--redis-client-cert', '--redis-client-cert', [CompletionResultType]::ParameterName, 'Client certificate (PEM) for rediss:// with mutual TLS')
            [CompletionResult]::new('--redis-client-key', '--redis-client-key', [CompletionResultType]::ParameterName, 'The client certificate''s private key (PEM)')
            [CompletionResult]::new('--mysql-ssl-mode', '--mysql-ssl-mode', [CompletionResultType]::ParameterName, 'MySQL TLS, as the mysql client''s --ssl-mode: verify-ca checks the certificate''s chain, verify-identity its host name too')
            [CompletionResult]::new('--mysql-ca-cert', '--mysql-ca-cert', [CompletionResultType]::ParameterName, 'CA certificate (PEM) to check the MySQL server''s certificate against (verify-ca, verify-identity) instead of the built-in roots')
            [CompletionResult]::new('--mysql-client-cert', '--mysql-client-cert', [CompletionResultType]::ParameterName, 'Client certificate (PEM) for MySQL with mutual TLS')
            [CompletionResult]::new('--mysql-client-key', '--mysql-client-key', [CompletionResultType]::ParameterName, 'The client certificate''s private key (PEM)')
            [CompletionResult]::new('-v', '-v', [CompletionResultType]::ParameterName, 'More log output on stderr (-v debug, -vv trace); RUST_LOG overrides')
            [CompletionResult]::new('--verbose', '--verbose', [CompletionResultType]::ParameterName, 'More log output on stderr (-v debug, -vv trace); RUST_LOG overrides')
            [CompletionResult]::new('-q', '-q', [CompletionResultType]::ParameterName, 'Only errors on stderr')
            [CompletionResult]::new('--quiet', '--quiet', [CompletionResultType]::ParameterName, 'Only errors on stderr')
            [CompletionResult]::new('-h', '-h', [CompletionResultType]::ParameterName, 'Print help (see more with ''--help'')')
            [CompletionResult]::new('--help', '--help', [CompletionResultType]::ParameterName, 'Print help (see more with ''--help'')')
            [CompletionResult]::new('-V', '-V ', [CompletionResultType]::ParameterName, 'Print version')
            [CompletionResult]::new('--version', '--version', [CompletionResultType]::ParameterName, 'Print version')
            [CompletionResult]::new('init', 'init', [CompletionResultType]::ParameterValue, 'Create or upgrade the MySQL schema and check both servers'' versions')
            [CompletionResult]::new('status', 'status', [CompletionResultType]::ParameterValue, 'One row per voucher: both stores side by side, in flight, dead letters, deadlines')
            [CompletionResult]::new('voucher', 'voucher', [CompletionResultType]::ParameterValue, 'Add and list vouchers (MySQL, the source of truth)')
            [CompletionResult]::new('preload', 'preload', [CompletionResultType]::ParameterValue, 'Load vouchers from MySQL into the Redis gate and register them for workers')
            [CompletionResult]::new('buy', 'buy', [CompletionResultType]::ParameterValue, 'One admission attempt through lua/seckill.lua (exit code tells the outcome)')
            [CompletionResult]::new('bench', 'bench', [CompletionResultType]::ParameterValue, 'Load-test the admission script and report attempts/s and latency')
            [CompletionResult]::new('token', 'token', [CompletionResultType]::ParameterValue, 'Admission tokens for vouchers that require them')
            [CompletionResult]::new('worker', 'worker', [CompletionResultType]::ParameterValue, 'Persist admitted orders to MySQL, cancel unpaid ones at their deadline (layers 2-5)')
            [CompletionResult]::new('serve', 'serve', [CompletionResultType]::ParameterValue, 'The HTTP front door: purchases, tokens, sale state, orders and payment over JSON')
            [CompletionResult]::new('pending', 'pending', [CompletionResultType]::ParameterValue, 'Show stream backlog, pending entries and dead letters; requeue dead letters')
            [CompletionResult]::new('pay', 'pay', [CompletionResultType]::ParameterValue, 'Mark a pending order paid (before its payment deadline)')
            [CompletionResult]::new('order', 'order', [CompletionResultType]::ParameterValue, 'Look up orders')
            [CompletionResult]::new('waitlist', 'waitlist', [CompletionResultType]::ParameterValue, 'Show a voucher''s waitlist and how many released units it received')
            [CompletionResult]::new('reconcile', 'reconcile', [CompletionResultType]::ParameterValue, 'Compare Redis with MySQL per voucher, classify drift, repair it safely')
            [CompletionResult]::new('doctor', 'doctor', [CompletionResultType]::ParameterValue, 'Check that the servers are set up so the guarantees hold (exit 5: warnings, 6: failures)')
            [CompletionResult]::new('generate', 'generate', [CompletionResultType]::ParameterValue, 'Write shell completions and man pages (for packagers)')
            [CompletionResult]::new('help', 'help', [CompletionResultType]::ParameterValue, 'Print this message or the help of the given subcommand(s)')
            break
        }
        'seckill;init' {
            [CompletionResult]::new('--format', '--format', [CompletionResultType]::ParameterName, 'Output format')
            [CompletionResult]::new('--redis-url', '--redis-url', [CompletionResultType]::ParameterName, 'Redis URL (redis://[:password@]host:port/[db])')
            [CompletionResult]::new('--mysql-url', '--mysql-url', [CompletionResultType]::ParameterName, 'MySQL URL (mysql://user:password@host:port/database) [default: mysql://seckill:***@127.0.0.1:13306/seckill]')
            [CompletionResult]::new('--prefix', '--prefix', [CompletionResultType]::ParameterName, 'Key prefix of every Redis key')
            [CompletionResult]::new('--connect-timeout', '--connect-timeout', [CompletionResultType]::ParameterName, 'How long to wait for a server to accept a connection')
            [CompletionResult]::new('--redis-password-file', '--redis-password-file', [CompletionResultType]::ParameterName, 'Read the Redis password from this file (one trailing newline is dropped), e.g. a systemd credential; the URL must then have none')
            [CompletionResult]::new('--mysql-password-file', '--mysql-password-file', [CompletionResultType]::ParameterName, 'Read the MySQL password from this file (one trailing newline is dropped), e.g. a systemd credential; the URL must then have none')
            [CompletionResult]::new('--redis-ca-cert', '--redis-ca-cert', [CompletionResultType]::ParameterName, 'CA certificate (PEM) to trust for rediss:// URLs instead of the system''s roots')
            [CompletionResult]::new('--redis-client-cert', '--redis-client-cert', [CompletionResultType]::ParameterName, 'Client certificate (PEM) for rediss:// with mutual TLS')
            [CompletionResult]::new('--redis-client-key', '--redis-client-key', [CompletionResultType]::ParameterName, 'The client certificate''s private key (PEM)')
            [CompletionResult]::new('--mysql-ssl-mode', '--mysql-ssl-mode', [CompletionResultType]::ParameterName, 'MySQL TLS, as the mysql client''s --ssl-mode: verify-ca checks the certificate''s chain, verify-identity its host name too')
            [CompletionResult]::new('--mysql-ca-cert', '--mysql-ca-cert', [CompletionResultType]::ParameterName, 'CA certificate (PEM) to check the MySQL server''s certificate against (verify-ca, verify-identity) instead of the built-in roots')
            [CompletionResult]::new('--mysql-client-cert', '--mysql-client-cert', [CompletionResultType]::ParameterName, 'Client certificate (PEM) for MySQL with mutual TLS')
            [CompletionResult]::new('--mysql-client-key', '--mysql-client-key', [CompletionResultType]::ParameterName, 'The client certificate''s private key (PEM)')
            [CompletionResult]::new('-v', '-v', [CompletionResultType]::ParameterName, 'More log output on stderr (-v debug, -vv trace); RUST_LOG overrides')
            [CompletionResult]::new('--verbose', '--verbose', [CompletionResultType]::ParameterName, 'More log output on stderr (-v debug, -vv trace); RUST_LOG overrides')
            [CompletionResult]::new('-q', '-q', [CompletionResultType]::ParameterName, 'Only errors on stderr')
            [CompletionResult]::new('--quiet', '--quiet', [CompletionResultType]::ParameterName, 'Only errors on stderr')
            [CompletionResult]::new('-h', '-h', [CompletionResultType]::ParameterName, 'Print help (see more with ''--help'')')
            [CompletionResult]::new('--help', '--help', [CompletionResultType]::ParameterName, 'Print help (see more with ''--help'')')
            [CompletionResult]::new('-V', '-V ', [CompletionResultType]::ParameterName, 'Print version')
            [CompletionResult]::new('--version', '--version', [CompletionResultType]::ParameterName, 'Print version')
            break
        }
        'seckill;status' {
            [CompletionResult]::new('--voucher', '--voucher', [CompletionResultType]::ParameterName, 'Only these vouchers (repeatable)')
            [CompletionResult]::new('--watch', '--watch', [CompletionResultType]::ParameterName, 'Refresh every so often until Ctrl-C (in place on a terminal)')
            [CompletionResult]::new('--format', '--format', [CompletionResultType]::ParameterName, 'Output format')
            [CompletionResult]::new('--redis-url', '--redis-url', [CompletionResultType]::ParameterName, 'Redis URL (redis://[:password@]host:port/[db])')
            [CompletionResult]::new('--mysql-url', '--mysql-url', [CompletionResultType]::ParameterName, 'MySQL URL (mysql://user:password@host:port/database) [default: mysql://seckill:***@127.0.0.1:13306/seckill]')
            [CompletionResult]::new('--prefix', '--prefix', [CompletionResultType]::ParameterName, 'Key prefix of every Redis key')
            [CompletionResult]::new('--connect-timeout', '--connect-timeout', [CompletionResultType]::ParameterName, 'How long to wait for a server to accept a connection')
            [CompletionResult]::new('--redis-password-file', '--redis-password-file', [CompletionResultType]::ParameterName, 'Read the Redis password from this file (one trailing newline is dropped), e.g. a systemd credential; the URL must then have none')
            [CompletionResult]::new('--mysql-password-file', '--mysql-password-file', [CompletionResultType]::ParameterName, 'Read the MySQL password from this file (one trailing newline is dropped), e.g. a systemd credential; the URL must then have none')
            [CompletionResult]::new('--redis-ca-cert', '--redis-ca-cert', [CompletionResultType]::ParameterName, 'CA certificate (PEM) to trust for rediss:// URLs instead of the system''s roots')
            [CompletionResult]::new('--redis-client-cert', '--redis-client-cert', [CompletionResultType]::ParameterName, 'Client certificate (PEM) for rediss:// with mutual TLS')
            [CompletionResult]::new('--redis-client-key', '--redis-client-key', [CompletionResultType]::ParameterName, 'The client certificate''s private key (PEM)')
            [CompletionResult]::new('--mysql-ssl-mode', '--mysql-ssl-mode', [CompletionResultType]::ParameterName, 'MySQL TLS, as the mysql client''s --ssl-mode: verify-ca checks the certificate''s chain, verify-identity its host name too')
            [CompletionResult]::new('--mysql-ca-cert', '--mysql-ca-cert', [CompletionResultType]::ParameterName, 'CA certificate (PEM) to check the MySQL server''s certificate against (verify-ca, verify-identity) instead of the built-in roots')
            [CompletionResult]::new('--mysql-client-cert', '--mysql-client-cert', [CompletionResultType]::ParameterName, 'Client certificate (PEM) for MySQL with mutual TLS')
            [CompletionResult]::new('--mysql-client-key', '--mysql-client-key', [CompletionResultType]::ParameterName, 'The client certificate''s private key (PEM)')
            [CompletionResult]::new('-v', '-v', [CompletionResultType]::ParameterName, 'More log output on stderr (-v debug, -vv trace); RUST_LOG overrides')
            [CompletionResult]::new('--verbose', '--verbose', [CompletionResultType]::ParameterName, 'More log output on stderr (-v debug, -vv trace); RUST_LOG overrides')
            [CompletionResult]::new('-q', '-q', [CompletionResultType]::ParameterName, 'Only errors on stderr')
            [CompletionResult]::new('--quiet', '--quiet', [CompletionResultType]::ParameterName, 'Only errors on stderr')
            [CompletionResult]::new('-h', '-h', [CompletionResultType]::ParameterName, 'Print help (see more with ''--help'')')
            [CompletionResult]::new('--help', '--help', [CompletionResultType]::ParameterName, 'Print help (see more with ''--help'')')
            [CompletionResult]::new('-V', '-V ', [CompletionResultType]::ParameterName, 'Print version')
            [CompletionResult]::new('--version', '--version', [CompletionResultType]::ParameterName, 'Print version')
            break
        }
        'seckill;voucher' {
            [CompletionResult]::new('--redis-url', '--redis-url', [CompletionResultType]::ParameterName, 'Redis URL (redis://[:password@]host:port/[db])')
            [CompletionResult]::new('--mysql-url', '--mysql-url', [CompletionResultType]::ParameterName, 'MySQL URL (mysql://user:password@host:port/database) [default: mysql://seckill:***@127.0.0.1:13306/seckill]')
            [CompletionResult]::new('--prefix', '--prefix', [CompletionResultType]::ParameterName, 'Key prefix of every Redis key')
            [CompletionResult]::new('--connect-timeout', '--connect-timeout', [CompletionResultType]::ParameterName, 'How long to wait for a server to accept a connection')
            [CompletionResult]::new('--redis-password-file', '--redis-password-file', [CompletionResultType]::ParameterName, 'Read the Redis password from this file (one trailing newline is dropped), e.g. a systemd credential; the URL must then have none')
            [CompletionResult]::new('--mysql-password-file', '--mysql-password-file', [CompletionResultType]::ParameterName, 'Read the MySQL password from this file (one trailing newline is dropped), e.g. a systemd credential; the URL must then have none')
            [CompletionResult]::new('--redis-ca-cert', '--redis-ca-cert', [CompletionResultType]::ParameterName, 'CA certificate (PEM) to trust for rediss:// URLs instead of the system''s roots')
            [CompletionResult]::new('--redis-client-cert', '--redis-client-cert', [CompletionResultType]::ParameterName, 'Client certificate (PEM) for rediss:// with mutual TLS')
            [CompletionResult]::new('--redis-client-key', '--redis-client-key', [CompletionResultType]::ParameterName, 'The client certificate''s private key (PEM)')
            [CompletionResult]::new('--mysql-ssl-mode', '--mysql-ssl-mode', [CompletionResultType]::ParameterName, 'MySQL TLS, as the mysql client''s --ssl-mode: verify-ca checks the certificate''s chain, verify-identity its host name too')
            [CompletionResult]::new('--mysql-ca-cert', '--mysql-ca-cert', [CompletionResultType]::ParameterName, 'CA certificate (PEM) to check the MySQL server''s certificate against (verify-ca, verify-identity) instead of the built-in roots')
            [CompletionResult]::new('--mysql-client-cert', '--mysql-client-cert', [CompletionResultType]::ParameterName, 'Client certificate (PEM) for MySQL with mutual TLS')
            [CompletionResult]::new('--mysql-client-key', '--mysql-client-key', [CompletionResultType]::ParameterName, 'The client certificate''s private key (PEM)')
            [CompletionResult]::new('-v', '-v', [CompletionResultType]::ParameterName, 'More log output on stderr (-v debug, -vv trace); RUST_LOG overrides')
            [CompletionResult]::new('--verbose', '--verbose', [CompletionResultType]::ParameterName, 'More log output on stderr (-v debug, -vv trace); RUST_LOG overrides')
            [CompletionResult]::new('-q', '-q', [CompletionResultType]::ParameterName, 'Only errors on stderr')
            [CompletionResult]::new('--quiet', '--quiet', [CompletionResultType]::ParameterName, 'Only errors on stderr')
            [CompletionResult]::new('-h', '-h', [CompletionResultType]::ParameterName, 'Print help')
            [CompletionResult]::new('--help', '--help', [CompletionResultType]::ParameterName, 'Print help')
            [CompletionResult]::new('-V', '-V ', [CompletionResultType]::ParameterName, 'Print version')
            [CompletionResult]::new('--version', '--version', [CompletionResultType]::ParameterName, 'Print version')
            [CompletionResult]::new('add', 'add', [CompletionResultType]::ParameterValue, 'Add a voucher to MySQL (then `seckill preload` opens it at the gate)')
            [CompletionResult]::new('update', 'update', [CompletionResultType]::ParameterValue, 'Change a voucher''s admission policy, in MySQL and at the gate at once')
            [CompletionResult]::new('list', 'list', [CompletionResultType]::ParameterValue, 'List vouchers: MySQL stock and orders beside the Redis gate''s state')
            [CompletionResult]::new('help', 'help', [CompletionResultType]::ParameterValue, 'Print this message or the help of the given subcommand(s)')
            break
        }
        'seckill;voucher;add' {
            [CompletionResult]::new('--id', '--id', [CompletionResultType]::ParameterName, 'Voucher id (1..=9223372036854775807)')
            [CompletionResult]::new('--stock', '--stock', [CompletionResultType]::ParameterName, 'Units for sale')
            [CompletionResult]::new('--begin', '--begin', [CompletionResultType]::ParameterName, 'Sale opens: RFC 3339, `now`, or relative like `+10m`')
            [CompletionResult]::new('--end', '--end', [CompletionResultType]::ParameterName, 'Sale closes: RFC 3339, `now`, or relative like `+2h` [default: begin + 24h]')
            [CompletionResult]::new('--pay-timeout', '--pay-timeout', [CompletionResultType]::ParameterName, 'Time a buyer has to pay before the unit is released')
            [CompletionResult]::new('--title', '--title', [CompletionResultType]::ParameterName, 'Title shown in listings')
            [CompletionResult]::new('--user-rate', '--user-rate', [CompletionResultType]::ParameterName, 'At most N attempts per user in any one second at the gate (0: no limit)')
            [CompletionResult]::new('--per-user-limit', '--per-user-limit', [CompletionResultType]::ParameterName, 'The most units one user may buy (one order of 1..=L units)')
            [CompletionResult]::new('--waitlist-limit', '--waitlist-limit', [CompletionResultType]::ParameterName, 'Once W requests wait, a sold-out attempt writes nothing (default: no cap)')
            [CompletionResult]::new('--buckets', '--buckets', [CompletionResultType]::ParameterName, 'Split the stock over N gates, each on a master of its own, so one voucher sells on N Redis masters (1: one gate)')
            [CompletionResult]::new('--format', '--format', [CompletionResultType]::ParameterName, 'Output format')
            [CompletionResult]::new('--redis-url', '--redis-url', [CompletionResultType]::ParameterName, 'Redis URL (redis://[:password@]host:port/[db])')
            [CompletionResult]::new('--mysql-url', '--mysql-url', [CompletionResultType]::ParameterName, 'MySQL URL (mysql://user:password@host:port/database) [default: mysql://seckill:***@127.0.0.1:13306/seckill]')
            [CompletionResult]::new('--prefix', '--prefix', [CompletionResultType]::ParameterName, 'Key prefix of every Redis key')
            [CompletionResult]::new('--connect-timeout', '--connect-timeout', [CompletionResultType]::ParameterName, 'How long to wait for a server to accept a connection')
            [CompletionResult]::new('--redis-password-file', '--redis-password-file', [CompletionResultType]::ParameterName, 'Read the Redis password from this file (one trailing newline is dropped), e.g. a systemd credential; the URL must then have none')
            [CompletionResult]::new('--mysql-password-file', '--mysql-password-file', [CompletionResultType]::ParameterName, 'Read the MySQL password from this file (one trailing newline is dropped), e.g. a systemd credential; the URL must then have none')
            [CompletionResult]::new('--redis-ca-cert', '--redis-ca-cert', [CompletionResultType]::ParameterName, 'CA certificate (PEM) to trust for rediss:// URLs instead of the system''s roots')
            [CompletionResult]::new('--redis-client-cert', '--redis-client-cert', [CompletionResultType]::ParameterName, 'Client certificate (PEM) for rediss:// with mutual TLS')
            [CompletionResult]::new('--redis-client-key', '--redis-client-key', [CompletionResultType]::ParameterName, 'The client certificate''s private key (PEM)')
            [CompletionResult]::new('--mysql-ssl-mode', '--mysql-ssl-mode', [CompletionResultType]::ParameterName, 'MySQL TLS, as the mysql client''s --ssl-mode: verify-ca checks the certificate''s chain, verify-identity its host name too')
            [CompletionResult]::new('--mysql-ca-cert', '--mysql-ca-cert', [CompletionResultType]::ParameterName, 'CA certificate (PEM) to check the MySQL server''s certificate against (verify-ca, verify-identity) instead of the built-in roots')
            [CompletionResult]::new('--mysql-client-cert', '--mysql-client-cert', [CompletionResultType]::ParameterName, 'Client certificate (PEM) for MySQL with mutual TLS')
            [CompletionResult]::new('--mysql-client-key', '--mysql-client-key', [CompletionResultType]::ParameterName, 'The client certificate''s private key (PEM)')
            [CompletionResult]::new('--require-token', '--require-token', [CompletionResultType]::ParameterName, 'Admission needs a token issued for the user (`seckill token issue`)')
            [CompletionResult]::new('-v', '-v', [CompletionResultType]::ParameterName, 'More log output on stderr (-v debug, -vv trace); RUST_LOG overrides')
            [CompletionResult]::new('--verbose', '--verbose', [CompletionResultType]::ParameterName, 'More log output on stderr (-v debug, -vv trace); RUST_LOG overrides')
            [CompletionResult]::new('-q', '-q', [CompletionResultType]::ParameterName, 'Only errors on stderr')
            [CompletionResult]::new('--quiet', '--quiet', [CompletionResultType]::ParameterName, 'Only errors on stderr')
            [CompletionResult]::new('-h', '-h', [CompletionResultType]::ParameterName, 'Print help (see more with ''--help'')')
            [CompletionResult]::new('--help', '--help', [CompletionResultType]::ParameterName, 'Print help (see more with ''--help'')')
            [CompletionResult]::new('-V', '-V ', [CompletionResultType]::ParameterName, 'Print version')
            [CompletionResult]::new('--version', '--version', [CompletionResultType]::ParameterName, 'Print version')
            break
        }
        'seckill;voucher;update' {
            [CompletionResult]::new('--id', '--id', [CompletionResultType]::ParameterName, 'Voucher id')
            [CompletionResult]::new('--user-rate', '--user-rate', [CompletionResultType]::ParameterName, 'At most N attempts per user in any one second at the gate (0: no limit)')
            [CompletionResult]::new('--per-user-limit', '--per-user-limit', [CompletionResultType]::ParameterName, 'The most units one user may buy (one order of 1..=L units)')
            [CompletionResult]::new('--waitlist-limit', '--waitlist-limit', [CompletionResultType]::ParameterName, 'Once W requests wait, a sold-out attempt writes nothing')
            [CompletionResult]::new('--buckets', '--buckets', [CompletionResultType]::ParameterName, 'Split the stock over N gates (only before the first preload)')
            [CompletionResult]::new('--format', '--format', [CompletionResultType]::ParameterName, 'Output format')
            [CompletionResult]::new('--redis-url', '--redis-url', [CompletionResultType]::ParameterName, 'Redis URL (redis://[:password@]host:port/[db])')
            [CompletionResult]::new('--mysql-url', '--mysql-url', [CompletionResultType]::ParameterName, 'MySQL URL (mysql://user:password@host:port/database) [default: mysql://seckill:***@127.0.0.1:13306/seckill]')
            [CompletionResult]::new('--prefix', '--prefix', [CompletionResultType]::ParameterName, 'Key prefix of every Redis key')
            [CompletionResult]::new('--connect-timeout', '--connect-timeout', [CompletionResultType]::ParameterName, 'How long to wait for a server to accept a connection')
            [CompletionResult]::new('--redis-password-file', '--redis-password-file', [CompletionResultType]::ParameterName, 'Read the Redis password from this file (one trailing newline is dropped), e.g. a systemd credential; the URL must then have none')
            [CompletionResult]::new('--mysql-password-file', '--mysql-password-file', [CompletionResultType]::ParameterName, 'Read the MySQL password from this file (one trailing newline is dropped), e.g. a systemd credential; the URL must then have none')
            [CompletionResult]::new('--redis-ca-cert', '--redis-ca-cert', [CompletionResultType]::ParameterName, 'CA certificate (PEM) to trust for rediss:// URLs instead of the system''s roots')
            [CompletionResult]::new('--redis-client-cert', '--redis-client-cert', [CompletionResultType]::ParameterName, 'Client certificate (PEM) for rediss:// with mutual TLS')
            [CompletionResult]::new('--redis-client-key', '--redis-client-key', [CompletionResultType]::ParameterName, 'The client certificate''s private key (PEM)')
            [CompletionResult]::new('--mysql-ssl-mode', '--mysql-ssl-mode', [CompletionResultType]::ParameterName, 'MySQL TLS, as the mysql client''s --ssl-mode: verify-ca checks the certificate''s chain, verify-identity its host name too')
            [CompletionResult]::new('--mysql-ca-cert', '--mysql-ca-cert', [CompletionResultType]::ParameterName, 'CA certificate (PEM) to check the MySQL server''s certificate against (verify-ca, verify-identity) instead of the built-in roots')
            [CompletionResult]::new('--mysql-client-cert', '--mysql-client-cert', [CompletionResultType]::ParameterName, 'Client certificate (PEM) for MySQL with mutual TLS')
            [CompletionResult]::new('--mysql-client-key', '--mysql-client-key', [CompletionResultType]::ParameterName, 'The client certificate''s private key (PEM)')
            [CompletionResult]::new('--require-token', '--require-token', [CompletionResultType]::ParameterName, 'Admission needs a token issued for the user')
            [CompletionResult]::new('--no-require-token', '--no-require-token', [CompletionResultType]::ParameterName, 'Admission needs no token')
            [CompletionResult]::new('--no-waitlist-limit', '--no-waitlist-limit', [CompletionResultType]::ParameterName, 'No cap on the waitlist')
            [CompletionResult]::new('-v', '-v', [CompletionResultType]::ParameterName, 'More log output on stderr (-v debug, -vv trace); RUST_LOG overrides')
            [CompletionResult]::new('--verbose', '--verbose', [CompletionResultType]::ParameterName, 'More log output on stderr (-v debug, -vv trace); RUST_LOG overrides')
            [CompletionResult]::new('-q', '-q', [CompletionResultType]::ParameterName, 'Only errors on stderr')
            [CompletionResult]::new('--quiet', '--quiet', [CompletionResultType]::ParameterName, 'Only errors on stderr')
            [CompletionResult]::new('-h', '-h', [CompletionResultType]::ParameterName, 'Print help (see more with ''--help'')')
            [CompletionResult]::new('--help', '--help', [CompletionResultType]::ParameterName, 'Print help (see more with ''--help'')')
            [CompletionResult]::new('-V', '-V ', [CompletionResultType]::ParameterName, 'Print version')
            [CompletionResult]::new('--version', '--version', [CompletionResultType]::ParameterName, 'Print version')
            break
        }
        'seckill;voucher;list' {
            [CompletionResult]::new('--voucher', '--voucher', [CompletionResultType]::ParameterName, 'Only these vouchers (repeatable)')
            [CompletionResult]::new('--format', '--format', [CompletionResultType]::ParameterName, 'Output format')
            [CompletionResult]::new('--redis-url', '--redis-url', [CompletionResultType]::ParameterName, 'Redis URL (redis://[:password@]host:port/[db])')
            [CompletionResult]::new('--mysql-url', '--mysql-url', [CompletionResultType]::ParameterName, 'MySQL URL (mysql://user:password@host:port/database) [default: mysql://seckill:***@127.0.0.1:13306/seckill]')
            [CompletionResult]::new('--prefix', '--prefix', [CompletionResultType]::ParameterName, 'Key prefix of every Redis key')
            [CompletionResult]::new('--connect-timeout', '--connect-timeout', [CompletionResultType]::ParameterName, 'How long to wait for a server to accept a connection')
            [CompletionResult]::new('--redis-password-file', '--redis-password-file', [CompletionResultType]::ParameterName, 'Read the Redis password from this file (one trailing newline is dropped), e.g. a systemd credential; the URL must then have none')
            [CompletionResult]::new('--mysql-password-file', '--mysql-password-file', [CompletionResultType]::ParameterName, 'Read the MySQL password from this file (one trailing newline is dropped), e.g. a systemd credential; the URL must then have none')
            [CompletionResult]::new('--redis-ca-cert', '--redis-ca-cert', [CompletionResultType]::ParameterName, 'CA certificate (PEM) to trust for rediss:// URLs instead of the system''s roots')
            [CompletionResult]::new('--redis-client-cert', '--redis-client-cert', [CompletionResultType]::ParameterName, 'Client certificate (PEM) for rediss:// with mutual TLS')
            [CompletionResult]::new('--redis-client-key', '--redis-client-key', [CompletionResultType]::ParameterName, 'The client certificate''s private key (PEM)')
            [CompletionResult]::new('--mysql-ssl-mode', '--mysql-ssl-mode', [CompletionResultType]::ParameterName, 'MySQL TLS, as the mysql client''s --ssl-mode: verify-ca checks the certificate''s chain, verify-identity its host name too')
            [CompletionResult]::new('--mysql-ca-cert', '--mysql-ca-cert', [CompletionResultType]::ParameterName, 'CA certificate (PEM) to check the MySQL server''s certificate against (verify-ca, verify-identity) instead of the built-in roots')
            [CompletionResult]::new('--mysql-client-cert', '--mysql-client-cert', [CompletionResultType]::ParameterName, 'Client certificate (PEM) for MySQL with mutual TLS')
            [CompletionResult]::new('--mysql-client-key', '--mysql-client-key', [CompletionResultType]::ParameterName, 'The client certificate''s private key (PEM)')
            [CompletionResult]::new('-v', '-v', [CompletionResultType]::ParameterName, 'More log output on stderr (-v debug, -vv trace); RUST_LOG overrides')
            [CompletionResult]::new('--verbose', '--verbose', [CompletionResultType]::ParameterName, 'More log output on stderr (-v debug, -vv trace); RUST_LOG overrides')
            [CompletionResult]::new('-q', '-q', [CompletionResultType]::ParameterName, 'Only errors on stderr')
            [CompletionResult]::new('--quiet', '--quiet', [CompletionResultType]::ParameterName, 'Only errors on stderr')
            [CompletionResult]::new('-h', '-h', [CompletionResultType]::ParameterName, 'Print help (see more with ''--help'')')
            [CompletionResult]::new('--help', '--help', [CompletionResultType]::ParameterName, 'Print help (see more with ''--help'')')
            [CompletionResult]::new('-V', '-V ', [CompletionResultType]::ParameterName, 'Print version')
            [CompletionResult]::new('--version', '--version', [CompletionResultType]::ParameterName, 'Print version')
            break
        }
        'seckill;voucher;help' {
            [CompletionResult]::new('add', 'add', [CompletionResultType]::ParameterValue, 'Add a voucher to MySQL (then `seckill preload` opens it at the gate)')
            [CompletionResult]::new('update', 'update', [CompletionResultType]::ParameterValue, 'Change a voucher''s admission policy, in MySQL and at the gate at once')
            [CompletionResult]::new('list', 'list', [CompletionResultType]::ParameterValue, 'List vouchers: MySQL stock and orders beside the Redis gate''s state')
            [CompletionResult]::new('help', 'help', [CompletionResultType]::ParameterValue, 'Print this message or the help of the given subcommand(s)')
            break
        }
        'seckill;voucher;help;add' {
            break
        }
        'seckill;voucher;help;update' {
            break
        }
        'seckill;voucher;help;list' {
            break
        }
        'seckill;voucher;help;help' {
            break
        }
        'seckill;preload' {
            [CompletionResult]::new('--voucher', '--voucher', [CompletionResultType]::ParameterName, 'The voucher to load')
            [CompletionResult]::new('--format', '--format', [CompletionResultType]::ParameterName, 'Output format')
            [CompletionResult]::new('--redis-url', '--redis-url', [CompletionResultType]::ParameterName, 'Redis URL (redis://[:password@]host:port/[db])')
            [CompletionResult]::new('--mysql-url', '--mysql-url', [CompletionResultType]::ParameterName, 'MySQL URL (mysql://user:password@host:port/database) [default: mysql://seckill:***@127.0.0.1:13306/seckill]')
            [CompletionResult]::new('--prefix', '--prefix', [CompletionResultType]::ParameterName, 'Key prefix of every Redis key')
            [CompletionResult]::new('--connect-timeout', '--connect-timeout', [CompletionResultType]::ParameterName, 'How long to wait for a server to accept a connection')
            [CompletionResult]::new('--redis-password-file', '--redis-password-file', [CompletionResultType]::ParameterName, 'Read the Redis password from this file (one trailing newline is dropped), e.g. a systemd credential; the URL must then have none')
            [CompletionResult]::new('--mysql-password-file', '--mysql-password-file', [CompletionResultType]::ParameterName, 'Read the MySQL password from this file (one trailing newline is dropped), e.g. a systemd credential; the URL must then have none')
            [CompletionResult]::new('--redis-ca-cert', '--redis-ca-cert', [CompletionResultType]::ParameterName, 'CA certificate (PEM) to trust for rediss:// URLs instead of the system''s roots')
            [CompletionResult]::new('--redis-client-cert', '--redis-client-cert', [CompletionResultType]::ParameterName, 'Client certificate (PEM) for rediss:// with mutual TLS')
            [CompletionResult]::new('--redis-client-key', '--redis-client-key', [CompletionResultType]::ParameterName, 'The client certificate''s private key (PEM)')
            [CompletionResult]::new('--mysql-ssl-mode', '--mysql-ssl-mode', [CompletionResultType]::ParameterName, 'MySQL TLS, as the mysql client''s --ssl-mode: verify-ca checks the certificate''s chain, verify-identity its host name too')
            [CompletionResult]::new('--mysql-ca-cert', '--mysql-ca-cert', [CompletionResultType]::ParameterName, 'CA certificate (PEM) to check the MySQL server''s certificate against (verify-ca, verify-identity) instead of the built-in roots')
            [CompletionResult]::new('--mysql-client-cert', '--mysql-client-cert', [CompletionResultType]::ParameterName, 'Client certificate (PEM) for MySQL with mutual TLS')
            [CompletionResult]::new('--mysql-client-key', '--mysql-client-key', [CompletionResultType]::ParameterName, 'The client certificate''s private key (PEM)')
            [CompletionResult]::new('--all', '--all', [CompletionResultType]::ParameterName, 'Load every voucher in MySQL')
            [CompletionResult]::new('--force', '--force', [CompletionResultType]::ParameterName, 'Load even while orders are in flight (this can re-admit sold units; prefer `seckill reconcile`)')
            [CompletionResult]::new('-v', '-v', [CompletionResultType]::ParameterName, 'More log output on stderr (-v debug, -vv trace); RUST_LOG overrides')
            [CompletionResult]::new('--verbose', '--verbose', [CompletionResultType]::ParameterName, 'More log output on stderr (-v debug, -vv trace); RUST_LOG overrides')
            [CompletionResult]::new('-q', '-q', [CompletionResultType]::ParameterName, 'Only errors on stderr')
            [CompletionResult]::new('--quiet', '--quiet', [CompletionResultType]::ParameterName, 'Only errors on stderr')
            [CompletionResult]::new('-h', '-h', [CompletionResultType]::ParameterName, 'Print help (see more with ''--help'')')
            [CompletionResult]::new('--help', '--help', [CompletionResultType]::ParameterName, 'Print help (see more with ''--help'')')
            [CompletionResult]::new('-V', '-V ', [CompletionResultType]::ParameterName, 'Print version')
            [CompletionResult]::new('--version', '--version', [CompletionResultType]::ParameterName, 'Print version')
            break
        }
        'seckill;buy' {
            [CompletionResult]::new('--voucher', '--voucher', [CompletionResultType]::ParameterName, 'Voucher id')
            [CompletionResult]::new('--user', '--user', [CompletionResultType]::ParameterName, 'User id')
            [CompletionResult]::new('--token', '--token', [CompletionResultType]::ParameterName, 'The user''s admission token (`seckill token issue`), for a voucher that requires one')
            [CompletionResult]::new('--quantity', '--quantity', [CompletionResultType]::ParameterName, 'Units to buy, all or none (1 ..= the voucher''s per-user limit)')
            [CompletionResult]::new('--idempotency-key', '--idempotency-key', [CompletionResultType]::ParameterName, 'An idempotency key (1 to 255 printable ASCII characters): run again with the same key and arguments, the command gives the first run''s outcome (and exit code) again instead of buying anew')
            [CompletionResult]::new('--idempotency-ttl', '--idempotency-ttl', [CompletionResultType]::ParameterName, 'How long --idempotency-key''s outcome is kept (1s ..= 30days)')
            [CompletionResult]::new('--client-reference', '--client-reference', [CompletionResultType]::ParameterName, 'Your own name for this purchase (1 to 64 printable ASCII characters), kept with the order, also when the request waits in line first')
            [CompletionResult]::new('--wait-replicas', '--wait-replicas', [CompletionResultType]::ParameterName, 'After a success, wait until N replicas of the voucher''s master have it (a failover to one of them then keeps it) [default: no wait]')
            [CompletionResult]::new('--wait-timeout', '--wait-timeout', [CompletionResultType]::ParameterName, 'The longest --wait-replicas waits before giving up (the admission stands either way)')
            [CompletionResult]::new('--node-id', '--node-id', [CompletionResultType]::ParameterName, 'Snowflake node id (0..=1023), leased from Redis: refused while another live process holds it [default: a free one, leased]')
            [CompletionResult]::new('--format', '--format', [CompletionResultType]::ParameterName, 'Output format')
            [CompletionResult]::new('--redis-url', '--redis-url', [CompletionResultType]::ParameterName, 'Redis URL (redis://[:password@]host:port/[db])')
            [CompletionResult]::new('--mysql-url', '--mysql-url', [CompletionResultType]::ParameterName, 'MySQL URL (mysql://user:password@host:port/database) [default: mysql://seckill:***@127.0.0.1:13306/seckill]')
            [CompletionResult]::new('--prefix', '--prefix', [CompletionResultType]::ParameterName, 'Key prefix of every Redis key')
            [CompletionResult]::new('--connect-timeout', '--connect-timeout', [CompletionResultType]::ParameterName, 'How long to wait for a server to accept a connection')
            [CompletionResult]::new('--redis-password-file', '--redis-password-file', [CompletionResultType]::ParameterName, 'Read the Redis password from this file (one trailing newline is dropped), e.g. a systemd credential; the URL must then have none')
            [CompletionResult]::new('--mysql-password-file', '--mysql-password-file', [CompletionResultType]::ParameterName, 'Read the MySQL password from this file (one trailing newline is dropped), e.g. a systemd credential; the URL must then have none')
            [CompletionResult]::new('--redis-ca-cert', '--redis-ca-cert', [CompletionResultType]::ParameterName, 'CA certificate (PEM) to trust for rediss:// URLs instead of the system''s roots')
            [CompletionResult]::new('--redis-client-cert', '--redis-client-cert', [CompletionResultType]::ParameterName, 'Client certificate (PEM) for rediss:// with mutual TLS')
            [CompletionResult]::new('--redis-client-key', '--redis-client-key', [CompletionResultType]::ParameterName, 'The client certificate''s private key (PEM)')
            [CompletionResult]::new('--mysql-ssl-mode', '--mysql-ssl-mode', [CompletionResultType]::ParameterName, 'MySQL TLS, as the mysql client''s --ssl-mode: verify-ca checks the certificate''s chain, verify-identity its host name too')
            [CompletionResult]::new('--mysql-ca-cert', '--mysql-ca-cert', [CompletionResultType]::ParameterName, 'CA certificate (PEM) to check the MySQL server''s certificate against (verify-ca, verify-identity) instead of the built-in roots')
            [CompletionResult]::new('--mysql-client-cert', '--mysql-client-cert', [CompletionResultType]::ParameterName, 'Client certificate (PEM) for MySQL with mutual TLS')
            [CompletionResult]::new('--mysql-client-key', '--mysql-client-key', [CompletionResultType]::ParameterName, 'The client certificate''s private key (PEM)')
            [CompletionResult]::new('-v', '-v', [CompletionResultType]::ParameterName, 'More log output on stderr (-v debug, -vv trace); RUST_LOG overrides')
            [CompletionResult]::new('--verbose', '--verbose', [CompletionResultType]::ParameterName, 'More log output on stderr (-v debug, -vv trace); RUST_LOG overrides')
            [CompletionResult]::new('-q', '-q', [CompletionResultType]::ParameterName, 'Only errors on stderr')
            [CompletionResult]::new('--quiet', '--quiet', [CompletionResultType]::ParameterName, 'Only errors on stderr')
            [CompletionResult]::new('-h', '-h', [CompletionResultType]::ParameterName, 'Print help (see more with ''--help'')')
            [CompletionResult]::new('--help', '--help', [CompletionResultType]::ParameterName, 'Print help (see more with ''--help'')')
            [CompletionResult]::new('-V', '-V ', [CompletionResultType]::ParameterName, 'Print version')
            [CompletionResult]::new('--version', '--version', [CompletionResultType]::ParameterName, 'Print version')
            break
        }
        'seckill;bench' {
            [CompletionResult]::new('--voucher', '--voucher', [CompletionResultType]::ParameterName, 'Voucher id (preloaded)')
            [CompletionResult]::new('--users', '--users', [CompletionResultType]::ParameterName, 'Distinct users; attempt i is made by user (user-offset + i mod users + 1)')
            [CompletionResult]::new('--user-offset', '--user-offset', [CompletionResultType]::ParameterName, 'First user id is user-offset + 1')
            [CompletionResult]::new('--attempts', '--attempts', [CompletionResultType]::ParameterName, 'Admission attempts in all')
            [CompletionResult]::new('--concurrency', '--concurrency', [CompletionResultType]::ParameterName, 'Attempts in flight at once')
            [CompletionResult]::new('--connections', '--connections', [CompletionResultType]::ParameterName, 'Redis connections the attempts are spread over')
            [CompletionResult]::new('--quantity', '--quantity', [CompletionResultType]::ParameterName, 'Units per attempt: K, or a range K-M drawn per attempt')
            [CompletionResult]::new('--wait-replicas', '--wait-replicas', [CompletionResultType]::ParameterName, 'After a success, wait until N replicas of the voucher''s master have it (a failover to one of them then keeps it) [default: no wait]')
            [CompletionResult]::new('--wait-timeout', '--wait-timeout', [CompletionResultType]::ParameterName, 'The longest --wait-replicas waits before giving up (the admission stands either way)')
            [CompletionResult]::new('--node-id', '--node-id', [CompletionResultType]::ParameterName, 'Snowflake node id (0..=1023), leased from Redis: refused while another live process holds it [default: a free one, leased]')
            [CompletionResult]::new('--format', '--format', [CompletionResultType]::ParameterName, 'Output format')
            [CompletionResult]::new('--redis-url', '--redis-url', [CompletionResultType]::ParameterName, 'Redis URL (redis://[:password@]host:port/[db])')
            [CompletionResult]::new('--mysql-url', '--mysql-url', [CompletionResultType]::ParameterName, 'MySQL URL (mysql://user:password@host:port/database) [default: mysql://seckill:***@127.0.0.1:13306/seckill]')
            [CompletionResult]::new('--prefix', '--prefix', [CompletionResultType]::ParameterName, 'Key prefix of every Redis key')
            [CompletionResult]::new('--connect-timeout', '--connect-timeout', [CompletionResultType]::ParameterName, 'How long to wait for a server to accept a connection')
            [CompletionResult]::new('--redis-password-file', '--redis-password-file', [CompletionResultType]::ParameterName, 'Read the Redis password from this file (one trailing newline is dropped), e.g. a systemd credential; the URL must then have none')
            [CompletionResult]::new('--mysql-password-file', '--mysql-password-file', [CompletionResultType]::ParameterName, 'Read the MySQL password from this file (one trailing newline is dropped), e.g. a systemd credential; the URL must then have none')
            [CompletionResult]::new('--redis-ca-cert', '--redis-ca-cert', [CompletionResultType]::ParameterName, 'CA certificate (PEM) to trust for rediss:// URLs instead of the system''s roots')
            [CompletionResult]::new('--redis-client-cert', '--redis-client-cert', [CompletionResultType]::ParameterName, 'Client certificate (PEM) for rediss:// with mutual TLS')
            [CompletionResult]::new('--redis-client-key', '--redis-client-key', [CompletionResultType]::ParameterName, 'The client certificate''s private key (PEM)')
            [CompletionResult]::new('--mysql-ssl-mode', '--mysql-ssl-mode', [CompletionResultType]::ParameterName, 'MySQL TLS, as the mysql client''s --ssl-mode: verify-ca checks the certificate''s chain, verify-identity its host name too')
            [CompletionResult]::new('--mysql-ca-cert', '--mysql-ca-cert', [CompletionResultType]::ParameterName, 'CA certificate (PEM) to check the MySQL server''s certificate against (verify-ca, verify-identity) instead of the built-in roots')
            [CompletionResult]::new('--mysql-client-cert', '--mysql-client-cert', [CompletionResultType]::ParameterName, 'Client certificate (PEM) for MySQL with mutual TLS')
            [CompletionResult]::new('--mysql-client-key', '--mysql-client-key', [CompletionResultType]::ParameterName, 'The client certificate''s private key (PEM)')
            [CompletionResult]::new('--tokens', '--tokens', [CompletionResultType]::ParameterName, 'Issue an admission token to every user first (timed apart from the attempts) and attempt with it')
            [CompletionResult]::new('-v', '-v', [CompletionResultType]::ParameterName, 'More log output on stderr (-v debug, -vv trace); RUST_LOG overrides')
            [CompletionResult]::new('--verbose', '--verbose', [CompletionResultType]::ParameterName, 'More log output on stderr (-v debug, -vv trace); RUST_LOG overrides')
            [CompletionResult]::new('-q', '-q', [CompletionResultType]::ParameterName, 'Only errors on stderr')
            [CompletionResult]::new('--quiet', '--quiet', [CompletionResultType]::ParameterName, 'Only errors on stderr')
            [CompletionResult]::new('-h', '-h', [CompletionResultType]::ParameterName, 'Print help (see more with ''--help'')')
            [CompletionResult]::new('--help', '--help', [CompletionResultType]::ParameterName, 'Print help (see more with ''--help'')')
            [CompletionResult]::new('-V', '-V ', [CompletionResultType]::ParameterName, 'Print version')
            [CompletionResult]::new('--version', '--version', [CompletionResultType]::ParameterName, 'Print version')
            break
        }
        'seckill;token' {
            [CompletionResult]::new('--redis-url', '--redis-url', [CompletionResultType]::ParameterName, 'Redis URL (redis://[:password@]host:port/[db])')
            [CompletionResult]::new('--mysql-url', '--mysql-url', [CompletionResultType]::ParameterName, 'MySQL URL (mysql://user:password@host:port/database) [default: mysql://seckill:***@127.0.0.1:13306/seckill]')
            [CompletionResult]::new('--prefix', '--prefix', [CompletionResultType]::ParameterName, 'Key prefix of every Redis key')
            [CompletionResult]::new('--connect-timeout', '--connect-timeout', [CompletionResultType]::ParameterName, 'How long to wait for a server to accept a connection')
            [CompletionResult]::new('--redis-password-file', '--redis-password-file', [CompletionResultType]::ParameterName, 'Read the Redis password from this file (one trailing newline is dropped), e.g. a systemd credential; the URL must then have none')
            [CompletionResult]::new('--mysql-password-file', '--mysql-password-file', [CompletionResultType]::ParameterName, 'Read the MySQL password from this file (one trailing newline is dropped), e.g. a systemd credential; the URL must then have none')
            [CompletionResult]::new('--redis-ca-cert', '--redis-ca-cert', [CompletionResultType]::ParameterName, 'CA certificate (PEM) to trust for rediss:// URLs instead of the system''s roots')
            [CompletionResult]::new('--redis-client-cert', '--redis-client-cert', [CompletionResultType]::ParameterName, 'Client certificate (PEM) for rediss:// with mutual TLS')
            [CompletionResult]::new('--redis-client-key', '--redis-client-key', [CompletionResultType]::ParameterName, 'The client certificate''s private key (PEM)')
            [CompletionResult]::new('--mysql-ssl-mode', '--mysql-ssl-mode', [CompletionResultType]::ParameterName, 'MySQL TLS, as the mysql client''s --ssl-mode: verify-ca checks the certificate''s chain, verify-identity its host name too')
            [CompletionResult]::new('--mysql-ca-cert', '--mysql-ca-cert', [CompletionResultType]::ParameterName, 'CA certificate (PEM) to check the MySQL server''s certificate against (verify-ca, verify-identity) instead of the built-in roots')
            [CompletionResult]::new('--mysql-client-cert', '--mysql-client-cert', [CompletionResultType]::ParameterName, 'Client certificate (PEM) for MySQL with mutual TLS')
            [CompletionResult]::new('--mysql-client-key', '--mysql-client-key', [CompletionResultType]::ParameterName, 'The client certificate''s private key (PEM)')
            [CompletionResult]::new('-v', '-v', [CompletionResultType]::ParameterName, 'More log output on stderr (-v debug, -vv trace); RUST_LOG overrides')
            [CompletionResult]::new('--verbose', '--verbose', [CompletionResultType]::ParameterName, 'More log output on stderr (-v debug, -vv trace); RUST_LOG overrides')
            [CompletionResult]::new('-q', '-q', [CompletionResultType]::ParameterName, 'Only errors on stderr')
            [CompletionResult]::new('--quiet', '--quiet', [CompletionResultType]::ParameterName, 'Only errors on stderr')
            [CompletionResult]::new('-h', '-h', [CompletionResultType]::ParameterName, 'Print help')
            [CompletionResult]::new('--help', '--help', [CompletionResultType]::ParameterName, 'Print help')
            [CompletionResult]::new('-V', '-V ', [CompletionResultType]::ParameterName, 'Print version')
            [CompletionResult]::new('--version', '--version', [CompletionResultType]::ParameterName, 'Print version')
            [CompletionResult]::new('issue', 'issue', [CompletionResultType]::ParameterValue, 'Issue a user''s admission token for a voucher that requires one')
            [CompletionResult]::new('help', 'help', [CompletionResultType]::ParameterValue, 'Print this message or the help of the given subcommand(s)')
            break
        }
        'seckill;token;issue' {
            [CompletionResult]::new('--voucher', '--voucher', [CompletionResultType]::ParameterName, 'Voucher id')
            [CompletionResult]::new('--user', '--user', [CompletionResultType]::ParameterName, 'User id')
            [CompletionResult]::new('--ttl', '--ttl', [CompletionResultType]::ParameterName, 'How long the token stays valid (at most 24h); issuing again replaces it')
            [CompletionResult]::new('--format', '--format', [CompletionResultType]::ParameterName, 'Output format')
            [CompletionResult]::new('--redis-url', '--redis-url', [CompletionResultType]::ParameterName, 'Redis URL (redis://[:password@]host:port/[db])')
            [CompletionResult]::new('--mysql-url', '--mysql-url', [CompletionResultType]::ParameterName, 'MySQL URL (mysql://user:password@host:port/database) [default: mysql://seckill:***@127.0.0.1:13306/seckill]')
            [CompletionResult]::new('--prefix', '--prefix', [CompletionResultType]::ParameterName, 'Key prefix of every Redis key')
            [CompletionResult]::new('--connect-timeout', '--connect-timeout', [CompletionResultType]::ParameterName, 'How long to wait for a server to accept a connection')
            [CompletionResult]::new('--redis-password-file', '--redis-password-file', [CompletionResultType]::ParameterName, 'Read the Redis password from this file (one trailing newline is dropped), e.g. a systemd credential; the URL must then have none')
            [CompletionResult]::new('--mysql-password-file', '--mysql-password-file', [CompletionResultType]::ParameterName, 'Read the MySQL password from this file (one trailing newline is dropped), e.g. a systemd credential; the URL must then have none')
            [CompletionResult]::new('--redis-ca-cert', '--redis-ca-cert', [CompletionResultType]::ParameterName, 'CA certificate (PEM) to trust for rediss:// URLs instead of the system''s roots')
            [CompletionResult]::new('--redis-client-cert', '--redis-client-cert', [CompletionResultType]::ParameterName, 'Client certificate (PEM) for rediss:// with mutual TLS')
            [CompletionResult]::new('--redis-client-key', '--redis-client-key', [CompletionResultType]::ParameterName, 'The client certificate''s private key (PEM)')
            [CompletionResult]::new('--mysql-ssl-mode', '--mysql-ssl-mode', [CompletionResultType]::ParameterName, 'MySQL TLS, as the mysql client''s --ssl-mode: verify-ca checks the certificate''s chain, verify-identity its host name too')
            [CompletionResult]::new('--mysql-ca-cert', '--mysql-ca-cert', [CompletionResultType]::ParameterName, 'CA certificate (PEM) to check the MySQL server''s certificate against (verify-ca, verify-identity) instead of the built-in roots')
            [CompletionResult]::new('--mysql-client-cert', '--mysql-client-cert', [CompletionResultType]::ParameterName, 'Client certificate (PEM) for MySQL with mutual TLS')
            [CompletionResult]::new('--mysql-client-key', '--mysql-client-key', [CompletionResultType]::ParameterName, 'The client certificate''s private key (PEM)')
            [CompletionResult]::new('-v', '-v', [CompletionResultType]::ParameterName, 'More log output on stderr (-v debug, -vv trace); RUST_LOG overrides')
            [CompletionResult]::new('--verbose', '--verbose', [CompletionResultType]::ParameterName, 'More log output on stderr (-v debug, -vv trace); RUST_LOG overrides')
            [CompletionResult]::new('-q', '-q', [CompletionResultType]::ParameterName, 'Only errors on stderr')
            [CompletionResult]::new('--quiet', '--quiet', [CompletionResultType]::ParameterName, 'Only errors on stderr')
            [CompletionResult]::new('-h', '-h', [CompletionResultType]::ParameterName, 'Print help (see more with ''--help'')')
            [CompletionResult]::new('--help', '--help', [CompletionResultType]::ParameterName, 'Print help (see more with ''--help'')')
            [CompletionResult]::new('-V', '-V ', [CompletionResultType]::ParameterName, 'Print version')
            [CompletionResult]::new('--version', '--version', [CompletionResultType]::ParameterName, 'Print version')
            break
        }
        'seckill;token;help' {
            [CompletionResult]::new('issue', 'issue', [CompletionResultType]::ParameterValue, 'Issue a user''s admission token for a voucher that requires one')
            [CompletionResult]::new('help', 'help', [CompletionResultType]::ParameterValue, 'Print this message or the help of the given subcommand(s)')
            break
        }
        'seckill;token;help;issue' {
            break
        }
        'seckill;token;help;help' {
            break
        }
        'seckill;worker' {
            [CompletionResult]::new('--consumer', '--consumer', [CompletionResultType]::ParameterName, 'Consumer name in the group, stable per instance [default: host-pid]')
            [CompletionResult]::new('--batch', '--batch', [CompletionResultType]::ParameterName, 'Entries read and persisted per batch (one MySQL transaction)')
            [CompletionResult]::new('--max-batch', '--max-batch', [CompletionResultType]::ParameterName, 'Largest batch while a backlog lasts: reads that come back full double the next one''s size up to this (--batch or less: no growth)')
            [CompletionResult]::new('--block', '--block', [CompletionResultType]::ParameterName, 'Longest wait of one blocking read for new entries')
            [CompletionResult]::new('--claim-idle', '--claim-idle', [CompletionResultType]::ParameterName, 'Reclaim entries another consumer has left pending this long')
            [CompletionResult]::new('--max-deliveries', '--max-deliveries', [CompletionResultType]::ParameterName, 'Dead-letter a message that cannot be persisted after this many deliveries')
            [CompletionResult]::new('--lock-lease', '--lock-lease', [CompletionResultType]::ParameterName, 'Lease of the per-(user, voucher) locks, renewed while a batch runs')
            [CompletionResult]::new('--mysql-timeout', '--mysql-timeout', [CompletionResultType]::ParameterName, 'Longest a batch''s (or a cancellation''s) MySQL transaction may take, from its connection to its COMMIT''s answer; past it, it is abandoned: its connection thrown away, its session ended, its batch left for another worker (more than half --lock-lease)')
            [CompletionResult]::new('--keep', '--keep', [CompletionResultType]::ParameterName, 'Trim acknowledged stream entries older than this')
            [CompletionResult]::new('--lanes', '--lanes', [CompletionResultType]::ParameterName, 'Batches in hand at once (one reads and locks while another commits)')
            [CompletionResult]::new('--deadline-lease', '--deadline-lease', [CompletionResultType]::ParameterName, 'A claimed payment deadline comes back after this long if its claimer died')
            [CompletionResult]::new('--sweep-every', '--sweep-every', [CompletionResultType]::ParameterName, 'How often MySQL is swept for pending orders whose deadline Redis lost')
            [CompletionResult]::new('--sweep-grace', '--sweep-grace', [CompletionResultType]::ParameterName, 'How far past its deadline a pending order must be for the sweep to cancel it')
            [CompletionResult]::new('--gate-check', '--gate-check', [CompletionResultType]::ParameterName, 'How often the gates are checked for writes Redis lost that MySQL holds (then paused, rebuilt from MySQL and reopened); 0s: never')
            [CompletionResult]::new('--node-id', '--node-id', [CompletionResultType]::ParameterName, 'Snowflake node id (0..=1023), leased from Redis: refused while another live process holds it [default: a free one, leased]')
            [CompletionResult]::new('--metrics-addr', '--metrics-addr', [CompletionResultType]::ParameterName, 'Serve Prometheus metrics at http://ADDR/metrics (e.g. 127.0.0.1:9464)')
            [CompletionResult]::new('--format', '--format', [CompletionResultType]::ParameterName, 'Output format')
            [CompletionResult]::new('--redis-url', '--redis-url', [CompletionResultType]::ParameterName, 'Redis URL (redis://[:password@]host:port/[db])')
            [CompletionResult]::new('--mysql-url', '--mysql-url', [CompletionResultType]::ParameterName, 'MySQL URL (mysql://user:password@host:port/database) [default: mysql://seckill:***@127.0.0.1:13306/seckill]')
            [CompletionResult]::new('--prefix', '--prefix', [CompletionResultType]::ParameterName, 'Key prefix of every Redis key')
            [CompletionResult]::new('--connect-timeout', '--connect-timeout', [CompletionResultType]::ParameterName, 'How long to wait for a server to accept a connection')
            [CompletionResult]::new('--redis-password-file', '--redis-password-file', [CompletionResultType]::ParameterName, 'Read the Redis password from this file (one trailing newline is dropped), e.g. a systemd credential; the URL must then have none')
            [CompletionResult]::new('--mysql-password-file', '--mysql-password-file', [CompletionResultType]::ParameterName, 'Read the MySQL password from this file (one trailing newline is dropped), e.g. a systemd credential; the URL must then have none')
            [CompletionResult]::new('--redis-ca-cert', '--redis-ca-cert', [CompletionResultType]::ParameterName, 'CA certificate (PEM) to trust for rediss:// URLs instead of the system''s roots')
            [CompletionResult]::new('--redis-client-cert', '--redis-client-cert', [CompletionResultType]::ParameterName, 'Client certificate (PEM) for rediss:// with mutual TLS')
            [CompletionResult]::new('--redis-client-key', '--redis-client-key', [CompletionResultType]::ParameterName, 'The client certificate''s private key (PEM)')
            [CompletionResult]::new('--mysql-ssl-mode', '--mysql-ssl-mode', [CompletionResultType]::ParameterName, 'MySQL TLS, as the mysql client''s --ssl-mode: verify-ca checks the certificate''s chain, verify-identity its host name too')
            [CompletionResult]::new('--mysql-ca-cert', '--mysql-ca-cert', [CompletionResultType]::ParameterName, 'CA certificate (PEM) to check the MySQL server''s certificate against (verify-ca, verify-identity) instead of the built-in roots')
            [CompletionResult]::new('--mysql-client-cert', '--mysql-client-cert', [CompletionResultType]::ParameterName, 'Client certificate (PEM) for MySQL with mutual TLS')
            [CompletionResult]::new('--mysql-client-key', '--mysql-client-key', [CompletionResultType]::ParameterName, 'The client certificate''s private key (PEM)')
            [CompletionResult]::new('--until-idle', '--until-idle', [CompletionResultType]::ParameterName, 'Exit 0 once no voucher has undelivered or pending entries (for cron)')
            [CompletionResult]::new('-v', '-v', [CompletionResultType]::ParameterName, 'More log output on stderr (-v debug, -vv trace); RUST_LOG overrides')
            [CompletionResult]::new('--verbose', '--verbose', [CompletionResultType]::ParameterName, 'More log output on stderr (-v debug, -vv trace); RUST_LOG overrides')
            [CompletionResult]::new('-q', '-q', [CompletionResultType]::ParameterName, 'Only errors on stderr')
            [CompletionResult]::new('--quiet', '--quiet', [CompletionResultType]::ParameterName, 'Only errors on stderr')
            [CompletionResult]::new('-h', '-h', [CompletionResultType]::ParameterName, 'Print help (see more with ''--help'')')
            [CompletionResult]::new('--help', '--help', [CompletionResultType]::ParameterName, 'Print help (see more with ''--help'')')
            [CompletionResult]::new('-V', '-V ', [CompletionResultType]::ParameterName, 'Print version')
            [CompletionResult]::new('--version', '--version', [CompletionResultType]::ParameterName, 'Print version')
            break
        }
        'seckill;serve' {
            [CompletionResult]::new('--listen', '--listen', [CompletionResultType]::ParameterName, 'Address to listen on (a non-loopback one needs --api-key-file)')
            [CompletionResult]::new('--api-key-file', '--api-key-file', [CompletionResultType]::ParameterName, 'File of API keys, one per line (blank lines and # comments skipped); every /v1 request must carry one as `Authorization: Bearer <key>`')
            [CompletionResult]::new('--max-in-flight', '--max-in-flight', [CompletionResultType]::ParameterName, 'Requests handled at once; more are answered 503 at once')
            [CompletionResult]::new('--request-timeout', '--request-timeout', [CompletionResultType]::ParameterName, 'A request not answered within this is answered 503 (outcome unknown)')
            [CompletionResult]::new('--header-timeout', '--header-timeout', [CompletionResultType]::ParameterName, 'A connection is closed when a request''s head has not arrived within this of its opening, or of its first byte after an answer')
            [CompletionResult]::new('--idle-timeout', '--idle-timeout', [CompletionResultType]::ParameterName, 'A keep-alive connection with no request for this long is closed (keep it above a load balancer''s idle timeout: 60 s on most)')
            [CompletionResult]::new('--max-connections', '--max-connections', [CompletionResultType]::ParameterName, 'Connections open at once (fewer if the descriptor limit leaves less room); at the cap the longest idle or slow ones are closed for newcomers')
            [CompletionResult]::new('--drain', '--drain', [CompletionResultType]::ParameterName, 'On SIGTERM/SIGINT, requests in flight get this long to finish')
            [CompletionResult]::new('--redis-connections', '--redis-connections', [CompletionResultType]::ParameterName, 'Multiplexed Redis connections shared by all requests')
            [CompletionResult]::new('--tls-cert', '--tls-cert', [CompletionResultType]::ParameterName, 'Serve HTTPS with this certificate chain (PEM; needs --tls-key)')
            [CompletionResult]::new('--tls-key', '--tls-key', [CompletionResultType]::ParameterName, 'The private key of --tls-cert (PEM)')
            [CompletionResult]::new('--metrics-addr', '--metrics-addr', [CompletionResultType]::ParameterName, 'Serve Prometheus metrics at http://ADDR/metrics (e.g. 127.0.0.1:9465) and not on --listen, which then answers 404 there')
            [CompletionResult]::new('--idempotency-ttl', '--idempotency-ttl', [CompletionResultType]::ParameterName, 'How long an Idempotency-Key''s answer is kept for resends (1s ..= 30days)')
            [CompletionResult]::new('--wait-replicas', '--wait-replicas', [CompletionResultType]::ParameterName, 'After a success, wait until N replicas of the voucher''s master have it (a failover to one of them then keeps it) [default: no wait]')
            [CompletionResult]::new('--wait-timeout', '--wait-timeout', [CompletionResultType]::ParameterName, 'The longest --wait-replicas waits before giving up (the admission stands either way)')
            [CompletionResult]::new('--node-id', '--node-id', [CompletionResultType]::ParameterName, 'Snowflake node id (0..=1023), leased from Redis: refused while another live process holds it [default: a free one, leased]')
            [CompletionResult]::new('--redis-url', '--redis-url', [CompletionResultType]::ParameterName, 'Redis URL (redis://[:password@]host:port/[db])')
            [CompletionResult]::new('--mysql-url', '--mysql-url', [CompletionResultType]::ParameterName, 'MySQL URL (mysql://user:password@host:port/database) [default: mysql://seckill:***@127.0.0.1:13306/seckill]')
            [CompletionResult]::new('--prefix', '--prefix', [CompletionResultType]::ParameterName, 'Key prefix of every Redis key')
            [CompletionResult]::new('--connect-timeout', '--connect-timeout', [CompletionResultType]::ParameterName, 'How long to wait for a server to accept a connection')
            [CompletionResult]::new('--redis-password-file', '--redis-password-file', [CompletionResultType]::ParameterName, 'Read the Redis password from this file (one trailing newline is dropped), e.g. a systemd credential; the URL must then have none')
            [CompletionResult]::new('--mysql-password-file', '--mysql-password-file', [CompletionResultType]::ParameterName, 'Read the MySQL password from this file (one trailing newline is dropped), e.g. a systemd credential; the URL must then have none')
            [CompletionResult]::new('--redis-ca-cert', '--redis-ca-cert', [CompletionResultType]::ParameterName, 'CA certificate (PEM) to trust for rediss:// URLs instead of the system''s roots')
            [CompletionResult]::new('--redis-client-cert', '--redis-client-cert', [CompletionResultType]::ParameterName, 'Client certificate (PEM) for rediss:// with mutual TLS')
            [CompletionResult]::new('--redis-client-key', '--redis-client-key', [CompletionResultType]::ParameterName, 'The client certificate''s private key (PEM)')
            [CompletionResult]::new('--mysql-ssl-mode', '--mysql-ssl-mode', [CompletionResultType]::ParameterName, 'MySQL TLS, as the mysql client''s --ssl-mode: verify-ca checks the certificate''s chain, verify-identity its host name too')
            [CompletionResult]::new('--mysql-ca-cert', '--mysql-ca-cert', [CompletionResultType]::ParameterName, 'CA certificate (PEM) to check the MySQL server''s certificate against (verify-ca, verify-identity) instead of the built-in roots')
            [CompletionResult]::new('--mysql-client-cert', '--mysql-client-cert', [CompletionResultType]::ParameterName, 'Client certificate (PEM) for MySQL with mutual TLS')
            [CompletionResult]::new('--mysql-client-key', '--mysql-client-key', [CompletionResultType]::ParameterName, 'The client certificate''s private key (PEM)')
            [CompletionResult]::new('-v', '-v', [CompletionResultType]::ParameterName, 'More log output on stderr (-v debug, -vv trace); RUST_LOG overrides')
            [CompletionResult]::new('--verbose', '--verbose', [CompletionResultType]::ParameterName, 'More log output on stderr (-v debug, -vv trace); RUST_LOG overrides')
            [CompletionResult]::new('-q', '-q', [CompletionResultType]::ParameterName, 'Only errors on stderr')
            [CompletionResult]::new('--quiet', '--quiet', [CompletionResultType]::ParameterName, 'Only errors on stderr')
            [CompletionResult]::new('-h', '-h', [CompletionResultType]::ParameterName, 'Print help')
            [CompletionResult]::new('--help', '--help', [CompletionResultType]::ParameterName, 'Print help')
            [CompletionResult]::new('-V', '-V ', [CompletionResultType]::ParameterName, 'Print version')
            [CompletionResult]::new('--version', '--version', [CompletionResultType]::ParameterName, 'Print version')
            break
        }
        'seckill;pending' {
            [CompletionResult]::new('--voucher', '--voucher', [CompletionResultType]::ParameterName, 'Show this voucher''s pending entries and dead letters')
            [CompletionResult]::new('--limit', '--limit', [CompletionResultType]::ParameterName, 'How many pending entries and dead letters to list')
            [CompletionResult]::new('--entry', '--entry', [CompletionResultType]::ParameterName, 'A dead-letter id to requeue (repeatable)')
            [CompletionResult]::new('--format', '--format', [CompletionResultType]::ParameterName, 'Output format')
            [CompletionResult]::new('--redis-url', '--redis-url', [CompletionResultType]::ParameterName, 'Redis URL (redis://[:password@]host:port/[db])')
            [CompletionResult]::new('--mysql-url', '--mysql-url', [CompletionResultType]::ParameterName, 'MySQL URL (mysql://user:password@host:port/database) [default: mysql://seckill:***@127.0.0.1:13306/seckill]')
            [CompletionResult]::new('--prefix', '--prefix', [CompletionResultType]::ParameterName, 'Key prefix of every Redis key')
            [CompletionResult]::new('--connect-timeout', '--connect-timeout', [CompletionResultType]::ParameterName, 'How long to wait for a server to accept a connection')
            [CompletionResult]::new('--redis-password-file', '--redis-password-file', [CompletionResultType]::ParameterName, 'Read the Redis password from this file (one trailing newline is dropped), e.g. a systemd credential; the URL must then have none')
            [CompletionResult]::new('--mysql-password-file', '--mysql-password-file', [CompletionResultType]::ParameterName, 'Read the MySQL password from this file (one trailing newline is dropped), e.g. a systemd credential; the URL must then have none')
            [CompletionResult]::new('--redis-ca-cert', '--redis-ca-cert', [CompletionResultType]::ParameterName, 'CA certificate (PEM) to trust for rediss:// URLs instead of the system''s roots')
            [CompletionResult]::new('--redis-client-cert', '--redis-client-cert', [CompletionResultType]::ParameterName, 'Client certificate (PEM) for rediss:// with mutual TLS')
            [CompletionResult]::new('--redis-client-key', '--redis-client-key', [CompletionResultType]::ParameterName, 'The client certificate''s private key (PEM)')
            [CompletionResult]::new('--mysql-ssl-mode', '--mysql-ssl-mode', [CompletionResultType]::ParameterName, 'MySQL TLS, as the mysql client''s --ssl-mode: verify-ca checks the certificate''s chain, verify-identity its host name too')
            [CompletionResult]::new('--mysql-ca-cert', '--mysql-ca-cert', [CompletionResultType]::ParameterName, 'CA certificate (PEM) to check the MySQL server''s certificate against (verify-ca, verify-identity) instead of the built-in roots')
            [CompletionResult]::new('--mysql-client-cert', '--mysql-client-cert', [CompletionResultType]::ParameterName, 'Client certificate (PEM) for MySQL with mutual TLS')
            [CompletionResult]::new('--mysql-client-key', '--mysql-client-key', [CompletionResultType]::ParameterName, 'The client certificate''s private key (PEM)')
            [CompletionResult]::new('--requeue', '--requeue', [CompletionResultType]::ParameterName, 'Move the voucher''s dead letters back into its order stream (after fixing their cause); with --entry only those')
            [CompletionResult]::new('-y', '-y', [CompletionResultType]::ParameterName, 'Do not ask for confirmation (for cron and scripts)')
            [CompletionResult]::new('--yes', '--yes', [CompletionResultType]::ParameterName, 'Do not ask for confirmation (for cron and scripts)')
            [CompletionResult]::new('-v', '-v', [CompletionResultType]::ParameterName, 'More log output on stderr (-v debug, -vv trace); RUST_LOG overrides')
            [CompletionResult]::new('--verbose', '--verbose', [CompletionResultType]::ParameterName, 'More log output on stderr (-v debug, -vv trace); RUST_LOG overrides')
            [CompletionResult]::new('-q', '-q', [CompletionResultType]::ParameterName, 'Only errors on stderr')
            [CompletionResult]::new('--quiet', '--quiet', [CompletionResultType]::ParameterName, 'Only errors on stderr')
            [CompletionResult]::new('-h', '-h', [CompletionResultType]::ParameterName, 'Print help (see more with ''--help'')')
            [CompletionResult]::new('--help', '--help', [CompletionResultType]::ParameterName, 'Print help (see more with ''--help'')')
            [CompletionResult]::new('-V', '-V ', [CompletionResultType]::ParameterName, 'Print version')
            [CompletionResult]::new('--version', '--version', [CompletionResultType]::ParameterName, 'Print version')
            break
        }
        'seckill;pay' {
            [CompletionResult]::new('--order', '--order', [CompletionResultType]::ParameterName, 'Order id')
            [CompletionResult]::new('--format', '--format', [CompletionResultType]::ParameterName, 'Output format')
            [CompletionResult]::new('--redis-url', '--redis-url', [CompletionResultType]::ParameterName, 'Redis URL (redis://[:password@]host:port/[db])')
            [CompletionResult]::new('--mysql-url', '--mysql-url', [CompletionResultType]::ParameterName, 'MySQL URL (mysql://user:password@host:port/database) [default: mysql://seckill:***@127.0.0.1:13306/seckill]')
            [CompletionResult]::new('--prefix', '--prefix', [CompletionResultType]::ParameterName, 'Key prefix of every Redis key')
            [CompletionResult]::new('--connect-timeout', '--connect-timeout', [CompletionResultType]::ParameterName, 'How long to wait for a server to accept a connection')
            [CompletionResult]::new('--redis-password-file', '--redis-password-file', [CompletionResultType]::ParameterName, 'Read the Redis password from this file (one trailing newline is dropped), e.g. a systemd credential; the URL must then have none')
            [CompletionResult]::new('--mysql-password-file', '--mysql-password-file', [CompletionResultType]::ParameterName, 'Read the MySQL password from this file (one trailing newline is dropped), e.g. a systemd credential; the URL must then have none')
            [CompletionResult]::new('--redis-ca-cert', '--redis-ca-cert', [CompletionResultType]::ParameterName, 'CA certificate (PEM) to trust for rediss:// URLs instead of the system''s roots')
            [CompletionResult]::new('--redis-client-cert', '--redis-client-cert', [CompletionResultType]::ParameterName, 'Client certificate (PEM) for rediss:// with mutual TLS')
            [CompletionResult]::new('--redis-client-key', '--redis-client-key', [CompletionResultType]::ParameterName, 'The client certificate''s private key (PEM)')
            [CompletionResult]::new('--mysql-ssl-mode', '--mysql-ssl-mode', [CompletionResultType]::ParameterName, 'MySQL TLS, as the mysql client''s --ssl-mode: verify-ca checks the certificate''s chain, verify-identity its host name too')
            [CompletionResult]::new('--mysql-ca-cert', '--mysql-ca-cert', [CompletionResultType]::ParameterName, 'CA certificate (PEM) to check the MySQL server''s certificate against (verify-ca, verify-identity) instead of the built-in roots')
            [CompletionResult]::new('--mysql-client-cert', '--mysql-client-cert', [CompletionResultType]::ParameterName, 'Client certificate (PEM) for MySQL with mutual TLS')
            [CompletionResult]::new('--mysql-client-key', '--mysql-client-key', [CompletionResultType]::ParameterName, 'The client certificate''s private key (PEM)')
            [CompletionResult]::new('-v', '-v', [CompletionResultType]::ParameterName, 'More log output on stderr (-v debug, -vv trace); RUST_LOG overrides')
            [CompletionResult]::new('--verbose', '--verbose', [CompletionResultType]::ParameterName, 'More log output on stderr (-v debug, -vv trace); RUST_LOG overrides')
            [CompletionResult]::new('-q', '-q', [CompletionResultType]::ParameterName, 'Only errors on stderr')
            [CompletionResult]::new('--quiet', '--quiet', [CompletionResultType]::ParameterName, 'Only errors on stderr')
            [CompletionResult]::new('-h', '-h', [CompletionResultType]::ParameterName, 'Print help (see more with ''--help'')')
            [CompletionResult]::new('--help', '--help', [CompletionResultType]::ParameterName, 'Print help (see more with ''--help'')')
            [CompletionResult]::new('-V', '-V ', [CompletionResultType]::ParameterName, 'Print version')
            [CompletionResult]::new('--version', '--version', [CompletionResultType]::ParameterName, 'Print version')
            break
        }
        'seckill;order' {
            [CompletionResult]::new('--redis-url', '--redis-url', [CompletionResultType]::ParameterName, 'Redis URL (redis://[:password@]host:port/[db])')
            [CompletionResult]::new('--mysql-url', '--mysql-url', [CompletionResultType]::ParameterName, 'MySQL URL (mysql://user:password@host:port/database) [default: mysql://seckill:***@127.0.0.1:13306/seckill]')
            [CompletionResult]::new('--prefix', '--prefix', [CompletionResultType]::ParameterName, 'Key prefix of every Redis key')
            [CompletionResult]::new('--connect-timeout', '--connect-timeout', [CompletionResultType]::ParameterName, 'How long to wait for a server to accept a connection')
            [CompletionResult]::new('--redis-password-file', '--redis-password-file', [CompletionResultType]::ParameterName, 'Read the Redis password from this file (one trailing newline is dropped), e.g. a systemd credential; the URL must then have none')
            [CompletionResult]::new('--mysql-password-file', '--mysql-password-file', [CompletionResultType]::ParameterName, 'Read the MySQL password from this file (one trailing newline is dropped), e.g. a systemd credential; the URL must then have none')
            [CompletionResult]::new('--redis-ca-cert', '--redis-ca-cert', [CompletionResultType]::ParameterName, 'CA certificate (PEM) to trust for rediss:// URLs instead of the system''s roots')
            [CompletionResult]::new('--redis-client-cert', '--redis-client-cert', [CompletionResultType]::ParameterName, 'Client certificate (PEM) for rediss:// with mutual TLS')
            [CompletionResult]::new('--redis-client-key', '--redis-client-key', [CompletionResultType]::ParameterName, 'The client certificate''s private key (PEM)')
            [CompletionResult]::new('--mysql-ssl-mode', '--mysql-ssl-mode', [CompletionResultType]::ParameterName, 'MySQL TLS, as the mysql client''s --ssl-mode: verify-ca checks the certificate''s chain, verify-identity its host name too')
            [CompletionResult]::new('--mysql-ca-cert', '--mysql-ca-cert', [CompletionResultType]::ParameterName, 'CA certificate (PEM) to check the MySQL server''s certificate against (verify-ca, verify-identity) instead of the built-in roots')
            [CompletionResult]::new('--mysql-client-cert', '--mysql-client-cert', [CompletionResultType]::ParameterName, 'Client certificate (PEM) for MySQL with mutual TLS')
            [CompletionResult]::new('--mysql-client-key', '--mysql-client-key', [CompletionResultType]::ParameterName, 'The client certificate''s private key (PEM)')
            [CompletionResult]::new('-v', '-v', [CompletionResultType]::ParameterName, 'More log output on stderr (-v debug, -vv trace); RUST_LOG overrides')
            [CompletionResult]::new('--verbose', '--verbose', [CompletionResultType]::ParameterName, 'More log output on stderr (-v debug, -vv trace); RUST_LOG overrides')
            [CompletionResult]::new('-q', '-q', [CompletionResultType]::ParameterName, 'Only errors on stderr')
            [CompletionResult]::new('--quiet', '--quiet', [CompletionResultType]::ParameterName, 'Only errors on stderr')
            [CompletionResult]::new('-h', '-h', [CompletionResultType]::ParameterName, 'Print help')
            [CompletionResult]::new('--help', '--help', [CompletionResultType]::ParameterName, 'Print help')
            [CompletionResult]::new('-V', '-V ', [CompletionResultType]::ParameterName, 'Print version')
            [CompletionResult]::new('--version', '--version', [CompletionResultType]::ParameterName, 'Print version')
            [CompletionResult]::new('show', 'show', [CompletionResultType]::ParameterValue, 'One order: status, user, voucher, created, payment deadline, paid/cancelled time')
            [CompletionResult]::new('unhold', 'unhold', [CompletionResultType]::ParameterValue, 'Let a held order''s payment deadline run (the payment provider has it unpaid): reconcile schedules it again, and past it the order is cancelled and its unit given back')
            [CompletionResult]::new('help', 'help', [CompletionResultType]::ParameterValue, 'Print this message or the help of the given subcommand(s)')
            break
        }
        'seckill;order;show' {
            [CompletionResult]::new('--format', '--format', [CompletionResultType]::ParameterName, 'Output format')
            [CompletionResult]::new('--redis-url', '--redis-url', [CompletionResultType]::ParameterName, 'Redis URL (redis://[:password@]host:port/[db])')
            [CompletionResult]::new('--mysql-url', '--mysql-url', [CompletionResultType]::ParameterName, 'MySQL URL (mysql://user:password@host:port/database) [default: mysql://seckill:***@127.0.0.1:13306/seckill]')
            [CompletionResult]::new('--prefix', '--prefix', [CompletionResultType]::ParameterName, 'Key prefix of every Redis key')
            [CompletionResult]::new('--connect-timeout', '--connect-timeout', [CompletionResultType]::ParameterName, 'How long to wait for a server to accept a connection')
            [CompletionResult]::new('--redis-password-file', '--redis-password-file', [CompletionResultType]::ParameterName, 'Read the Redis password from this file (one trailing newline is dropped), e.g. a systemd credential; the URL must then have none')
            [CompletionResult]::new('--mysql-password-file', '--mysql-password-file', [CompletionResultType]::ParameterName, 'Read the MySQL password from this file (one trailing newline is dropped), e.g. a systemd credential; the URL must then have none')
            [CompletionResult]::new('--redis-ca-cert', '--redis-ca-cert', [CompletionResultType]::ParameterName, 'CA certificate (PEM) to trust for rediss:// URLs instead of the system''s roots')
            [CompletionResult]::new('--redis-client-cert', '--redis-client-cert', [CompletionResultType]::ParameterName, 'Client certificate (PEM) for rediss:// with mutual TLS')
            [CompletionResult]::new('--redis-client-key', '--redis-client-key', [CompletionResultType]::ParameterName, 'The client certificate''s private key (PEM)')
            [CompletionResult]::new('--mysql-ssl-mode', '--mysql-ssl-mode', [CompletionResultType]::ParameterName, 'MySQL TLS, as the mysql client''s --ssl-mode: verify-ca checks the certificate''s chain, verify-identity its host name too')
            [CompletionResult]::new('--mysql-ca-cert', '--mysql-ca-cert', [CompletionResultType]::ParameterName, 'CA certificate (PEM) to check the MySQL server''s certificate against (verify-ca, verify-identity) instead of the built-in roots')
            [CompletionResult]::new('--mysql-client-cert', '--mysql-client-cert', [CompletionResultType]::ParameterName, 'Client certificate (PEM) for MySQL with mutual TLS')
            [CompletionResult]::new('--mysql-client-key', '--mysql-client-key', [CompletionResultType]::ParameterName, 'The client certificate''s private key (PEM)')
            [CompletionResult]::new('-v', '-v', [CompletionResultType]::ParameterName, 'More log output on stderr (-v debug, -vv trace); RUST_LOG overrides')
            [CompletionResult]::new('--verbose', '--verbose', [CompletionResultType]::ParameterName, 'More log output on stderr (-v debug, -vv trace); RUST_LOG overrides')
            [CompletionResult]::new('-q', '-q', [CompletionResultType]::ParameterName, 'Only errors on stderr')
            [CompletionResult]::new('--quiet', '--quiet', [CompletionResultType]::ParameterName, 'Only errors on stderr')
            [CompletionResult]::new('-h', '-h', [CompletionResultType]::ParameterName, 'Print help (see more with ''--help'')')
            [CompletionResult]::new('--help', '--help', [CompletionResultType]::ParameterName, 'Print help (see more with ''--help'')')
            [CompletionResult]::new('-V', '-V ', [CompletionResultType]::ParameterName, 'Print version')
            [CompletionResult]::new('--version', '--version', [CompletionResultType]::ParameterName, 'Print version')
            break
        }
        'seckill;order;unhold' {
            [CompletionResult]::new('--order', '--order', [CompletionResultType]::ParameterName, 'Order id')
            [CompletionResult]::new('--redis-url', '--redis-url', [CompletionResultType]::ParameterName, 'Redis URL (redis://[:password@]host:port/[db])')
            [CompletionResult]::new('--mysql-url', '--mysql-url', [CompletionResultType]::ParameterName, 'MySQL URL (mysql://user:password@host:port/database) [default: mysql://seckill:***@127.0.0.1:13306/seckill]')
            [CompletionResult]::new('--prefix', '--prefix', [CompletionResultType]::ParameterName, 'Key prefix of every Redis key')
            [CompletionResult]::new('--connect-timeout', '--connect-timeout', [CompletionResultType]::ParameterName, 'How long to wait for a server to accept a connection')
            [CompletionResult]::new('--redis-password-file', '--redis-password-file', [CompletionResultType]::ParameterName, 'Read the Redis password from this file (one trailing newline is dropped), e.g. a systemd credential; the URL must then have none')
            [CompletionResult]::new('--mysql-password-file', '--mysql-password-file', [CompletionResultType]::ParameterName, 'Read the MySQL password from this file (one trailing newline is dropped), e.g. a systemd credential; the URL must then have none')
            [CompletionResult]::new('--redis-ca-cert', '--redis-ca-cert', [CompletionResultType]::ParameterName, 'CA certificate (PEM) to trust for rediss:// URLs instead of the system''s roots')
            [CompletionResult]::new('--redis-client-cert', '--redis-client-cert', [CompletionResultType]::ParameterName, 'Client certificate (PEM) for rediss:// with mutual TLS')
            [CompletionResult]::new('--redis-client-key', '--redis-client-key', [CompletionResultType]::ParameterName, 'The client certificate''s private key (PEM)')
            [CompletionResult]::new('--mysql-ssl-mode', '--mysql-ssl-mode', [CompletionResultType]::ParameterName, 'MySQL TLS, as the mysql client''s --ssl-mode: verify-ca checks the certificate''s chain, verify-identity its host name too')
            [CompletionResult]::new('--mysql-ca-cert', '--mysql-ca-cert', [CompletionResultType]::ParameterName, 'CA certificate (PEM) to check the MySQL server''s certificate against (verify-ca, verify-identity) instead of the built-in roots')
            [CompletionResult]::new('--mysql-client-cert', '--mysql-client-cert', [CompletionResultType]::ParameterName, 'Client certificate (PEM) for MySQL with mutual TLS')
            [CompletionResult]::new('--mysql-client-key', '--mysql-client-key', [CompletionResultType]::ParameterName, 'The client certificate''s private key (PEM)')
            [CompletionResult]::new('-v', '-v', [CompletionResultType]::ParameterName, 'More log output on stderr (-v debug, -vv trace); RUST_LOG overrides')
            [CompletionResult]::new('--verbose', '--verbose', [CompletionResultType]::ParameterName, 'More log output on stderr (-v debug, -vv trace); RUST_LOG overrides')
            [CompletionResult]::new('-q', '-q', [CompletionResultType]::ParameterName, 'Only errors on stderr')
            [CompletionResult]::new('--quiet', '--quiet', [CompletionResultType]::ParameterName, 'Only errors on stderr')
            [CompletionResult]::new('-h', '-h', [CompletionResultType]::ParameterName, 'Print help')
            [CompletionResult]::new('--help', '--help', [CompletionResultType]::ParameterName, 'Print help')
            [CompletionResult]::new('-V', '-V ', [CompletionResultType]::ParameterName, 'Print version')
            [CompletionResult]::new('--version', '--version', [CompletionResultType]::ParameterName, 'Print version')
            break
        }
        'seckill;order;help' {
            [CompletionResult]::new('show', 'show', [CompletionResultType]::ParameterValue, 'One order: status, user, voucher, created, payment deadline, paid/cancelled time')
            [CompletionResult]::new('unhold', 'unhold', [CompletionResultType]::ParameterValue, 'Let a held order''s payment deadline run (the payment provider has it unpaid): reconcile schedules it again, and past it the order is cancelled and its unit given back')
            [CompletionResult]::new('help', 'help', [CompletionResultType]::ParameterValue, 'Print this message or the help of the given subcommand(s)')
            break
        }
        'seckill;order;help;show' {
            break
        }
        'seckill;order;help;unhold' {
            break
        }
        'seckill;order;help;help' {
            break
        }
        'seckill;waitlist' {
            [CompletionResult]::new('--voucher', '--voucher', [CompletionResultType]::ParameterName, 'Voucher id')
            [CompletionResult]::new('--limit', '--limit', [CompletionResultType]::ParameterName, 'How many users from the head of the line to show')
            [CompletionResult]::new('--format', '--format', [CompletionResultType]::ParameterName, 'Output format')
            [CompletionResult]::new('--redis-url', '--redis-url', [CompletionResultType]::ParameterName, 'Redis URL (redis://[:password@]host:port/[db])')
            [CompletionResult]::new('--mysql-url', '--mysql-url', [CompletionResultType]::ParameterName, 'MySQL URL (mysql://user:password@host:port/database) [default: mysql://seckill:***@127.0.0.1:13306/seckill]')
            [CompletionResult]::new('--prefix', '--prefix', [CompletionResultType]::ParameterName, 'Key prefix of every Redis key')
            [CompletionResult]::new('--connect-timeout', '--connect-timeout', [CompletionResultType]::ParameterName, 'How long to wait for a server to accept a connection')
            [CompletionResult]::new('--redis-password-file', '--redis-password-file', [CompletionResultType]::ParameterName, 'Read the Redis password from this file (one trailing newline is dropped), e.g. a systemd credential; the URL must then have none')
            [CompletionResult]::new('--mysql-password-file', '--mysql-password-file', [CompletionResultType]::ParameterName, 'Read the MySQL password from this file (one trailing newline is dropped), e.g. a systemd credential; the URL must then have none')
            [CompletionResult]::new('--redis-ca-cert', '--redis-ca-cert', [CompletionResultType]::ParameterName, 'CA certificate (PEM) to trust for rediss:// URLs instead of the system''s roots')
            [CompletionResult]::new('--redis-client-cert', '--redis-client-cert', [CompletionResultType]::ParameterName, 'Client certificate (PEM) for rediss:// with mutual TLS')
            [CompletionResult]::new('--redis-client-key', '--redis-client-key', [CompletionResultType]::ParameterName, 'The client certificate''s private key (PEM)')
            [CompletionResult]::new('--mysql-ssl-mode', '--mysql-ssl-mode', [CompletionResultType]::ParameterName, 'MySQL TLS, as the mysql client''s --ssl-mode: verify-ca checks the certificate''s chain, verify-identity its host name too')
            [CompletionResult]::new('--mysql-ca-cert', '--mysql-ca-cert', [CompletionResultType]::ParameterName, 'CA certificate (PEM) to check the MySQL server''s certificate against (verify-ca, verify-identity) instead of the built-in roots')
            [CompletionResult]::new('--mysql-client-cert', '--mysql-client-cert', [CompletionResultType]::ParameterName, 'Client certificate (PEM) for MySQL with mutual TLS')
            [CompletionResult]::new('--mysql-client-key', '--mysql-client-key', [CompletionResultType]::ParameterName, 'The client certificate''s private key (PEM)')
            [CompletionResult]::new('-v', '-v', [CompletionResultType]::ParameterName, 'More log output on stderr (-v debug, -vv trace); RUST_LOG overrides')
            [CompletionResult]::new('--verbose', '--verbose', [CompletionResultType]::ParameterName, 'More log output on stderr (-v debug, -vv trace); RUST_LOG overrides')
            [CompletionResult]::new('-q', '-q', [CompletionResultType]::ParameterName, 'Only errors on stderr')
            [CompletionResult]::new('--quiet', '--quiet', [CompletionResultType]::ParameterName, 'Only errors on stderr')
            [CompletionResult]::new('-h', '-h', [CompletionResultType]::ParameterName, 'Print help (see more with ''--help'')')
            [CompletionResult]::new('--help', '--help', [CompletionResultType]::ParameterName, 'Print help (see more with ''--help'')')
            [CompletionResult]::new('-V', '-V ', [CompletionResultType]::ParameterName, 'Print version')
            [CompletionResult]::new('--version', '--version', [CompletionResultType]::ParameterName, 'Print version')
            break
        }
        'seckill;reconcile' {
            [CompletionResult]::new('--voucher', '--voucher', [CompletionResultType]::ParameterName, 'Only these vouchers (repeatable) [default: every voucher registered at the gate or holding orders in MySQL]')
            [CompletionResult]::new('--drop-lost-commits', '--drop-lost-commits', [CompletionResultType]::ParameterName, 'Drop the buyers whose orders MySQL may have lost with their stream entries (drift orders_lost_unrestorable), their units back on sale: give the amount the report names (one --voucher only)')
            [CompletionResult]::new('--attempts', '--attempts', [CompletionResultType]::ParameterName, 'How often to re-read a voucher that keeps moving before calling it busy')
            [CompletionResult]::new('--settle', '--settle', [CompletionResultType]::ParameterName, 'Cancellations and new orders younger than this are still being handled by a worker, not drift (keep it above the worker''s --deadline-lease)')
            [CompletionResult]::new('--node-id', '--node-id', [CompletionResultType]::ParameterName, 'Snowflake node id (0..=1023), leased from Redis: refused while another live process holds it [default: a free one, leased]')
            [CompletionResult]::new('--format', '--format', [CompletionResultType]::ParameterName, 'Output format')
            [CompletionResult]::new('--redis-url', '--redis-url', [CompletionResultType]::ParameterName, 'Redis URL (redis://[:password@]host:port/[db])')
            [CompletionResult]::new('--mysql-url', '--mysql-url', [CompletionResultType]::ParameterName, 'MySQL URL (mysql://user:password@host:port/database) [default: mysql://seckill:***@127.0.0.1:13306/seckill]')
            [CompletionResult]::new('--prefix', '--prefix', [CompletionResultType]::ParameterName, 'Key prefix of every Redis key')
            [CompletionResult]::new('--connect-timeout', '--connect-timeout', [CompletionResultType]::ParameterName, 'How long to wait for a server to accept a connection')
            [CompletionResult]::new('--redis-password-file', '--redis-password-file', [CompletionResultType]::ParameterName, 'Read the Redis password from this file (one trailing newline is dropped), e.g. a systemd credential; the URL must then have none')
            [CompletionResult]::new('--mysql-password-file', '--mysql-password-file', [CompletionResultType]::ParameterName, 'Read the MySQL password from this file (one trailing newline is dropped), e.g. a systemd credential; the URL must then have none')
            [CompletionResult]::new('--redis-ca-cert', '--redis-ca-cert', [CompletionResultType]::ParameterName, 'CA certificate (PEM) to trust for rediss:// URLs instead of the system''s roots')
            [CompletionResult]::new('--redis-client-cert', '--redis-client-cert', [CompletionResultType]::ParameterName, 'Client certificate (PEM) for rediss:// with mutual TLS')
            [CompletionResult]::new('--redis-client-key', '--redis-client-key', [CompletionResultType]::ParameterName, 'The client certificate''s private key (PEM)')
            [CompletionResult]::new('--mysql-ssl-mode', '--mysql-ssl-mode', [CompletionResultType]::ParameterName, 'MySQL TLS, as the mysql client''s --ssl-mode: verify-ca checks the certificate''s chain, verify-identity its host name too')
            [CompletionResult]::new('--mysql-ca-cert', '--mysql-ca-cert', [CompletionResultType]::ParameterName, 'CA certificate (PEM) to check the MySQL server''s certificate against (verify-ca, verify-identity) instead of the built-in roots')
            [CompletionResult]::new('--mysql-client-cert', '--mysql-client-cert', [CompletionResultType]::ParameterName, 'Client certificate (PEM) for MySQL with mutual TLS')
            [CompletionResult]::new('--mysql-client-key', '--mysql-client-key', [CompletionResultType]::ParameterName, 'The client certificate''s private key (PEM)')
            [CompletionResult]::new('--dry-run', '--dry-run', [CompletionResultType]::ParameterName, 'Report what would be repaired; change nothing')
            [CompletionResult]::new('--fix-mysql', '--fix-mysql', [CompletionResultType]::ParameterName, 'Also repair MySQL when its stock + active orders != total')
            [CompletionResult]::new('--deep', '--deep', [CompletionResultType]::ParameterName, 'Read every voucher in full (every order, buyer, release and deadline) and count MySQL''s orders again, instead of comparing counts and digests first; finds a counter or digest that drifted from its rows')
            [CompletionResult]::new('-y', '-y', [CompletionResultType]::ParameterName, 'Do not ask for confirmation (for cron and scripts)')
            [CompletionResult]::new('--yes', '--yes', [CompletionResultType]::ParameterName, 'Do not ask for confirmation (for cron and scripts)')
            [CompletionResult]::new('-v', '-v', [CompletionResultType]::ParameterName, 'More log output on stderr (-v debug, -vv trace); RUST_LOG overrides')
            [CompletionResult]::new('--verbose', '--verbose', [CompletionResultType]::ParameterName, 'More log output on stderr (-v debug, -vv trace); RUST_LOG overrides')
            [CompletionResult]::new('-q', '-q', [CompletionResultType]::ParameterName, 'Only errors on stderr')
            [CompletionResult]::new('--quiet', '--quiet', [CompletionResultType]::ParameterName, 'Only errors on stderr')
            [CompletionResult]::new('-h', '-h', [CompletionResultType]::ParameterName, 'Print help (see more with ''--help'')')
            [CompletionResult]::new('--help', '--help', [CompletionResultType]::ParameterName, 'Print help (see more with ''--help'')')
            [CompletionResult]::new('-V', '-V ', [CompletionResultType]::ParameterName, 'Print version')
            [CompletionResult]::new('--version', '--version', [CompletionResultType]::ParameterName, 'Print version')
            break
        }
        'seckill;doctor' {
            [CompletionResult]::new('--role', '--role', [CompletionResultType]::ParameterName, 'Also try the rights this role''s users need (contrib/redis-acl.conf, contrib/mysql-grants.sql), as the users of the URLs, writing nothing')
            [CompletionResult]::new('--format', '--format', [CompletionResultType]::ParameterName, 'Output format')
            [CompletionResult]::new('--redis-url', '--redis-url', [CompletionResultType]::ParameterName, 'Redis URL (redis://[:password@]host:port/[db])')
            [CompletionResult]::new('--mysql-url', '--mysql-url', [CompletionResultType]::ParameterName, 'MySQL URL (mysql://user:password@host:port/database) [default: mysql://seckill:***@127.0.0.1:13306/seckill]')
            [CompletionResult]::new('--prefix', '--prefix', [CompletionResultType]::ParameterName, 'Key prefix of every Redis key')
            [CompletionResult]::new('--connect-timeout', '--connect-timeout', [CompletionResultType]::ParameterName, 'How long to wait for a server to accept a connection')
            [CompletionResult]::new('--redis-password-file', '--redis-password-file', [CompletionResultType]::ParameterName, 'Read the Redis password from this file (one trailing newline is dropped), e.g. a systemd credential; the URL must then have none')
            [CompletionResult]::new('--mysql-password-file', '--mysql-password-file', [CompletionResultType]::ParameterName, 'Read the MySQL password from this file (one trailing newline is dropped), e.g. a systemd credential; the URL must then have none')
            [CompletionResult]::new('--redis-ca-cert', '--redis-ca-cert', [CompletionResultType]::ParameterName, 'CA certificate (PEM) to trust for rediss:// URLs instead of the system''s roots')
            [CompletionResult]::new('--redis-client-cert', '--redis-client-cert', [CompletionResultType]::ParameterName, 'Client certificate (PEM) for rediss:// with mutual TLS')
            [CompletionResult]::new('--redis-client-key', '--redis-client-key', [CompletionResultType]::ParameterName, 'The client certificate''s private key (PEM)')
            [CompletionResult]::new('--mysql-ssl-mode', '--mysql-ssl-mode', [CompletionResultType]::ParameterName, 'MySQL TLS, as the mysql client''s --ssl-mode: verify-ca checks the certificate''s chain, verify-identity its host name too')
            [CompletionResult]::new('--mysql-ca-cert', '--mysql-ca-cert', [CompletionResultType]::ParameterName, 'CA certificate (PEM) to check the MySQL server''s certificate against (verify-ca, verify-identity) instead of the built-in roots')
            [CompletionResult]::new('--mysql-client-cert', '--mysql-client-cert', [CompletionResultType]::ParameterName, 'Client certificate (PEM) for MySQL with mutual TLS')
            [CompletionResult]::new('--mysql-client-key', '--mysql-client-key', [CompletionResultType]::ParameterName, 'The client certificate''s private key (PEM)')
            [CompletionResult]::new('-v', '-v', [CompletionResultType]::ParameterName, 'More log output on stderr (-v debug, -vv trace); RUST_LOG overrides')
            [CompletionResult]::new('--verbose', '--verbose', [CompletionResultType]::ParameterName, 'More log output on stderr (-v debug, -vv trace); RUST_LOG overrides')
            [CompletionResult]::new('-q', '-q', [CompletionResultType]::ParameterName, 'Only errors on stderr')
            [CompletionResult]::new('--quiet', '--quiet', [CompletionResultType]::ParameterName, 'Only errors on stderr')
            [CompletionResult]::new('-h', '-h', [CompletionResultType]::ParameterName, 'Print help (see more with ''--help'')')
            [CompletionResult]::new('--help', '--help', [CompletionResultType]::ParameterName, 'Print help (see more with ''--help'')')
            [CompletionResult]::new('-V', '-V ', [CompletionResultType]::ParameterName, 'Print version')
            [CompletionResult]::new('--version', '--version', [CompletionResultType]::ParameterName, 'Print version')
            break
        }
        'seckill;generate' {
            [CompletionResult]::new('--out-dir', '--out-dir', [CompletionResultType]::ParameterName, 'Directory that receives completions/ and man/')
            [CompletionResult]::new('--redis-url', '--redis-url', [CompletionResultType]::ParameterName, 'Redis URL (redis://[:password@]host:port/[db])')
            [CompletionResult]::new('--mysql-url', '--mysql-url', [CompletionResultType]::ParameterName, 'MySQL URL (mysql://user:password@host:port/database) [default: mysql://seckill:***@127.0.0.1:13306/seckill]')
            [CompletionResult]::new('--prefix', '--prefix', [CompletionResultType]::ParameterName, 'Key prefix of every Redis key')
            [CompletionResult]::new('--connect-timeout', '--connect-timeout', [CompletionResultType]::ParameterName, 'How long to wait for a server to accept a connection')
            [CompletionResult]::new('--redis-password-file', '--redis-password-file', [CompletionResultType]::ParameterName, 'Read the Redis password from this file (one trailing newline is dropped), e.g. a systemd credential; the URL must then have none')
            [CompletionResult]::new('--mysql-password-file', '--mysql-password-file', [CompletionResultType]::ParameterName, 'Read the MySQL password from this file (one trailing newline is dropped), e.g. a systemd credential; the URL must then have none')
            [CompletionResult]::new('--redis-ca-cert', '--redis-ca-cert', [CompletionResultType]::ParameterName, 'CA certificate (PEM) to trust for rediss:// URLs instead of the system''s roots')
            [CompletionResult]::new('--redis-client-cert', '--redis-client-cert', [CompletionResultType]::ParameterName, 'Client certificate (PEM) for rediss:// with mutual TLS')
            [CompletionResult]::new('--redis-client-key', '--redis-client-key', [CompletionResultType]::ParameterName, 'The client certificate''s private key (PEM)')
            [CompletionResult]::new('--mysql-ssl-mode', '--mysql-ssl-mode', [CompletionResultType]::ParameterName, 'MySQL TLS, as the mysql client''s --ssl-mode: verify-ca checks the certificate''s chain, verify-identity its host name too')
            [CompletionResult]::new('--mysql-ca-cert', '--mysql-ca-cert', [CompletionResultType]::ParameterName, 'CA certificate (PEM) to check the MySQL server''s certificate against (verify-ca, verify-identity) instead of the built-in roots')
            [CompletionResult]::new('--mysql-client-cert', '--mysql-client-cert', [CompletionResultType]::ParameterName, 'Client certificate (PEM) for MySQL with mutual TLS')
            [CompletionResult]::new('--mysql-client-key', '--mysql-client-key', [CompletionResultType]::ParameterName, 'The client certificate''s private key (PEM)')
            [CompletionResult]::new('-v', '-v', [CompletionResultType]::ParameterName, 'More log output on stderr (-v debug, -vv trace); RUST_LOG overrides')
            [CompletionResult]::new('--verbose', '--verbose', [CompletionResultType]::ParameterName, 'More log output on stderr (-v debug, -vv trace); RUST_LOG overrides')
            [CompletionResult]::new('-q', '-q', [CompletionResultType]::ParameterName, 'Only errors on stderr')
            [CompletionResult]::new('--quiet', '--quiet', [CompletionResultType]::ParameterName, 'Only errors on stderr')
            [CompletionResult]::new('-h', '-h', [CompletionResultType]::ParameterName, 'Print help')
            [CompletionResult]::new('--help', '--help', [CompletionResultType]::ParameterName, 'Print help')
            [CompletionResult]::new('-V', '-V ', [CompletionResultType]::ParameterName, 'Print version')
            [CompletionResult]::new('--version', '--version', [CompletionResultType]::ParameterName, 'Print version')
            break
        }
        'seckill;help' {
            [CompletionResult]::new('init', 'init', [CompletionResultType]::ParameterValue, 'Create or upgrade the MySQL schema and check both servers'' versions')
            [CompletionResult]::new('status', 'status', [CompletionResultType]::ParameterValue, 'One row per voucher: both stores side by side, in flight, dead letters, deadlines')
            [CompletionResult]::new('voucher', 'voucher', [CompletionResultType]::ParameterValue, 'Add and list vouchers (MySQL, the source of truth)')
            [CompletionResult]::new('preload', 'preload', [CompletionResultType]::ParameterValue, 'Load vouchers from MySQL into the Redis gate and register them for workers')
            [CompletionResult]::new('buy', 'buy', [CompletionResultType]::ParameterValue, 'One admission attempt through lua/seckill.lua (exit code tells the outcome)')
            [CompletionResult]::new('bench', 'bench', [CompletionResultType]::ParameterValue, 'Load-test the admission script and report attempts/s and latency')
            [CompletionResult]::new('token', 'token', [CompletionResultType]::ParameterValue, 'Admission tokens for vouchers that require them')
            [CompletionResult]::new('worker', 'worker', [CompletionResultType]::ParameterValue, 'Persist admitted orders to MySQL, cancel unpaid ones at their deadline (layers 2-5)')
            [CompletionResult]::new('serve', 'serve', [CompletionResultType]::ParameterValue, 'The HTTP front door: purchases, tokens, sale state, orders and payment over JSON')
            [CompletionResult]::new('pending', 'pending', [CompletionResultType]::ParameterValue, 'Show stream backlog, pending entries and dead letters; requeue dead letters')
            [CompletionResult]::new('pay', 'pay', [CompletionResultType]::ParameterValue, 'Mark a pending order paid (before its payment deadline)')
            [CompletionResult]::new('order', 'order', [CompletionResultType]::ParameterValue, 'Look up orders')
            [CompletionResult]::new('waitlist', 'waitlist', [CompletionResultType]::ParameterValue, 'Show a voucher''s waitlist and how many released units it received')
            [CompletionResult]::new('reconcile', 'reconcile', [CompletionResultType]::ParameterValue, 'Compare Redis with MySQL per voucher, classify drift, repair it safely')
            [CompletionResult]::new('doctor', 'doctor', [CompletionResultType]::ParameterValue, 'Check that the servers are set up so the guarantees hold (exit 5: warnings, 6: failures)')
            [CompletionResult]::new('generate', 'generate', [CompletionResultType]::ParameterValue, 'Write shell completions and man pages (for packagers)')
            [CompletionResult]::new('help', 'help', [CompletionResultType]::ParameterValue, 'Print this message or the help of the given subcommand(s)')
            break
        }
        'seckill;help;init' {
            break
        }
        'seckill;help;status' {
            break
        }
        'seckill;help;voucher' {
            [CompletionResult]::new('add', 'add', [CompletionResultType]::ParameterValue, 'Add a voucher to MySQL (then `seckill preload` opens it at the gate)')
            [CompletionResult]::new('update', 'update', [CompletionResultType]::ParameterValue, 'Change a voucher''s admission policy, in MySQL and at the gate at once')
            [CompletionResult]::new('list', 'list', [CompletionResultType]::ParameterValue, 'List vouchers: MySQL stock and orders beside the Redis gate''s state')
            break
        }
        'seckill;help;voucher;add' {
            break
        }
        'seckill;help;voucher;update' {
            break
        }
        'seckill;help;voucher;list' {
            break
        }
        'seckill;help;preload' {
            break
        }
        'seckill;help;buy' {
            break
        }
        'seckill;help;bench' {
            break
        }
        'seckill;help;token' {
            [CompletionResult]::new('issue', 'issue', [CompletionResultType]::ParameterValue, 'Issue a user''s admission token for a voucher that requires one')
            break
        }
        'seckill;help;token;issue' {
            break
        }
        'seckill;help;worker' {
            break
        }
        'seckill;help;serve' {
            break
        }
        'seckill;help;pending' {
            break
        }
        'seckill;help;pay' {
            break
        }
        'seckill;help;order' {
            [CompletionResult]::new('show', 'show', [CompletionResultType]::ParameterValue, 'One order: status, user, voucher, created, payment deadline, paid/cancelled time')
            [CompletionResult]::new('unhold', 'unhold', [CompletionResultType]::ParameterValue, 'Let a held order''s payment deadline run (the payment provider has it unpaid): reconcile schedules it again, and past it the order is cancelled and its unit given back')
            break
        }
        'seckill;help;order;show' {
            break
        }
        'seckill;help;order;unhold' {
            break
        }
        'seckill;help;waitlist' {
            break
        }
        'seckill;help;reconcile' {
            break
        }
        'seckill;help;doctor' {
            break
        }
        'seckill;help;generate' {
            break
        }
        'seckill;help;help' {
            break
        }
    })

    $completions.Where{ $_.CompletionText -like "$wordToComplete*" } |
        Sort-Object -Property ListItemText
}
