# Print an optspec for argparse to handle cmd's options that are independent of any subcommand.
function __fish_seckill_global_optspecs
    string join \n redis-url= mysql-url= prefix= connect-timeout= redis-password-file= mysql-password-file= redis-ca-cert= redis-client-cert= redis-client-key= mysql-ssl-mode= mysql-ca-cert= mysql-client-cert= mysql-client-key= v/verbose q/quiet h/help V/version
end

function __fish_seckill_needs_command
    # Figure out if the current invocation already has a command.
    set -l cmd (commandline -opc)
    set -e cmd[1]
    argparse -s (__fish_seckill_global_optspecs) -- $cmd 2>/dev/null
    or return
    if set -q argv[1]
        # Also print the command, so this can be used to figure out what it is.
        echo $argv[1]
        return 1
    end
    return 0
end

function __fish_seckill_using_subcommand
    set -l cmd (__fish_seckill_needs_command)
    test -z "$cmd"
    and return 1
    contains -- $cmd[1] $argv
end

complete -c seckill -n "__fish_seckill_needs_command" -l redis-url -d 'Redis URL (redis://[:password@]host:port/[db])' -r
complete -c seckill -n "__fish_seckill_needs_command" -l mysql-url -d 'MySQL URL (mysql://user:password@host:port/database) [default: mysql://seckill:***@127.0.0.1:13306/seckill]' -r
complete -c seckill -n "__fish_seckill_needs_command" -l prefix -d 'Key prefix of every Redis key' -r
complete -c seckill -n "__fish_seckill_needs_command" -l connect-timeout -d 'How long to wait for a server to accept a connection' -r
complete -c seckill -n "__fish_seckill_needs_command" -l redis-password-file -d 'Read the Redis password from this file (one trailing newline is dropped), e.g. a systemd credential; the URL must then have none' -r -F
complete -c seckill -n "__fish_seckill_needs_command" -l mysql-password-file -d 'Read the MySQL password from this file (one trailing newline is dropped), e.g. a systemd credential; the URL must then have none' -r -F
complete -c seckill -n "__fish_seckill_needs_command" -l redis-ca-cert -d 'CA certificate (PEM) to trust for rediss:// URLs instead of the system\'s roots' -r -F
complete -c seckill -n "__fish_seckill_needs_command" -l redis-client-cert -d 'Client certificate (PEM) for rediss:// with mutual TLS' -r -F
complete -c seckill -n "__fish_seckill_needs_command" -l redis-client-key -d 'The client certificate\'s private key (PEM)' -r -F
complete -c seckill -n "__fish_seckill_needs_command" -l mysql-ssl-mode -d 'MySQL TLS, as the mysql client\'s --ssl-mode: verify-ca checks the certificate\'s chain, verify-identity its host name too' -r -f -a "disabled\t''
preferred\t''
required\t''
verify-ca\t''
verify-identity\t''"
complete -c seckill -n "__fish_seckill_needs_command" -l mysql-ca-cert -d 'CA certificate (PEM) to check the MySQL server\'s certificate against (verify-ca, verify-identity) instead of the built-in roots' -r -F
complete -c seckill -n "__fish_seckill_needs_command" -l mysql-client-cert -d 'Client certificate (PEM) for MySQL with mutual TLS' -r -F
complete -c seckill -n "__fish_seckill_needs_command" -l mysql-client-key -d 'The client certificate\'s private key (PEM)' -r -F
complete -c seckill -n "__fish_seckill_needs_command" -s v -l verbose -d 'More log output on stderr (-v debug, -vv trace); RUST_LOG overrides'
complete -c seckill -n "__fish_seckill_needs_command" -s q -l quiet -d 'Only errors on stderr'
complete -c seckill -n "__fish_seckill_needs_command" -s h -l help -d 'Print help (see more with \'--help\')'
complete -c seckill -n "__fish_seckill_needs_command" -s V -l version -d 'Print version'
complete -c seckill -n "__fish_seckill_needs_command" -f -a "init" -d 'Create or upgrade the MySQL schema and check both servers\' versions'
complete -c seckill -n "__fish_seckill_needs_command" -f -a "status" -d 'One row per voucher: both stores side by side, in flight, dead letters, deadlines'
complete -c seckill -n "__fish_seckill_needs_command" -f -a "voucher" -d 'Add and list vouchers (MySQL, the source of truth)'
complete -c seckill -n "__fish_seckill_needs_command" -f -a "preload" -d 'Load vouchers from MySQL into the Redis gate and register them for workers'
complete -c seckill -n "__fish_seckill_needs_command" -f -a "buy" -d 'One admission attempt through lua/seckill.lua (exit code tells the outcome)'
complete -c seckill -n "__fish_seckill_needs_command" -f -a "bench" -d 'Load-test the admission script and report attempts/s and latency'
complete -c seckill -n "__fish_seckill_needs_command" -f -a "token" -d 'Admission tokens for vouchers that require them'
complete -c seckill -n "__fish_seckill_needs_command" -f -a "worker" -d 'Persist admitted orders to MySQL, cancel unpaid ones at their deadline (layers 2-5)'
complete -c seckill -n "__fish_seckill_needs_command" -f -a "serve" -d 'The HTTP front door: purchases, tokens, sale state, orders and payment over JSON'
complete -c seckill -n "__fish_seckill_needs_command" -f -a "pending" -d 'Show stream backlog, pending entries and dead letters; requeue dead letters'
complete -c seckill -n "__fish_seckill_needs_command" -f -a "pay" -d 'Mark a pending order paid (before its payment deadline)'
complete -c seckill -n "__fish_seckill_needs_command" -f -a "order" -d 'Look up orders'
complete -c seckill -n "__fish_seckill_needs_command" -f -a "waitlist" -d 'Show a voucher\'s waitlist and how many released units it received'
complete -c seckill -n "__fish_seckill_needs_command" -f -a "reconcile" -d 'Compare Redis with MySQL per voucher, classify drift, repair it safely'
complete -c seckill -n "__fish_seckill_needs_command" -f -a "doctor" -d 'Check that the servers are set up so the guarantees hold (exit 5: warnings, 6: failures)'
complete -c seckill -n "__fish_seckill_needs_command" -f -a "generate" -d 'Write shell completions and man pages (for packagers)'
complete -c seckill -n "__fish_seckill_needs_command" -f -a "help" -d 'Print this message or the help of the given subcommand(s)'
complete -c seckill -n "__fish_seckill_using_subcommand init" -l format -d 'Output format' -r -f -a "table\t'A table for people'
json\t'JSON for scripts'"
complete -c seckill -n "__fish_seckill_using_subcommand init" -l redis-url -d 'Redis URL (redis://[:password@]host:port/[db])' -r
complete -c seckill -n "__fish_seckill_using_subcommand init" -l mysql-url -d 'MySQL URL (mysql://user:password@host:port/database) [default: mysql://seckill:***@127.0.0.1:13306/seckill]' -r
complete -c seckill -n "__fish_seckill_using_subcommand init" -l prefix -d 'Key prefix of every Redis key' -r
complete -c seckill -n "__fish_seckill_using_subcommand init" -l connect-timeout -d 'How long to wait for a server to accept a connection' -r
complete -c seckill -n "__fish_seckill_using_subcommand init" -l redis-password-file -d 'Read the Redis password from this file (one trailing newline is dropped), e.g. a systemd credential; the URL must then have none' -r -F
complete -c seckill -n "__fish_seckill_using_subcommand init" -l mysql-password-file -d 'Read the MySQL password from this file (one trailing newline is dropped), e.g. a systemd credential; the URL must then have none' -r -F
complete -c seckill -n "__fish_seckill_using_subcommand init" -l redis-ca-cert -d 'CA certificate (PEM) to trust for rediss:// URLs instead of the system\'s roots' -r -F
complete -c seckill -n "__fish_seckill_using_subcommand init" -l redis-client-cert -d 'Client certificate (PEM) for rediss:// with mutual TLS' -r -F
complete -c seckill -n "__fish_seckill_using_subcommand init" -l redis-client-key -d 'The client certificate\'s private key (PEM)' -r -F
complete -c seckill -n "__fish_seckill_using_subcommand init" -l mysql-ssl-mode -d 'MySQL TLS, as the mysql client\'s --ssl-mode: verify-ca checks the certificate\'s chain, verify-identity its host name too' -r -f -a "disabled\t''
preferred\t''
required\t''
verify-ca\t''
verify-identity\t''"
complete -c seckill -n "__fish_seckill_using_subcommand init" -l mysql-ca-cert -d 'CA certificate (PEM) to check the MySQL server\'s certificate against (verify-ca, verify-identity) instead of the built-in roots' -r -F
complete -c seckill -n "__fish_seckill_using_subcommand init" -l mysql-client-cert -d 'Client certificate (PEM) for MySQL with mutual TLS' -r -F
complete -c seckill -n "__fish_seckill_using_subcommand init" -l mysql-client-key -d 'The client certificate\'s private key (PEM)' -r -F
complete -c seckill -n "__fish_seckill_using_subcommand init" -s v -l verbose -d 'More log output on stderr (-v debug, -vv trace); RUST_LOG overrides'
complete -c seckill -n "__fish_seckill_using_subcommand init" -s q -l quiet -d 'Only errors on stderr'
complete -c seckill -n "__fish_seckill_using_subcommand init" -s h -l help -d 'Print help (see more with \'--help\')'
complete -c seckill -n "__fish_seckill_using_subcommand init" -s V -l version -d 'Print version'
complete -c seckill -n "__fish_seckill_using_subcommand status" -l voucher -d 'Only these vouchers (repeatable)' -r
complete -c seckill -n "__fish_seckill_using_subcommand status" -l watch -d 'Refresh every so often until Ctrl-C (in place on a terminal)' -r
complete -c seckill -n "__fish_seckill_using_subcommand status" -l format -d 'Output format' -r -f -a "table\t'A table for people'
json\t'JSON for scripts'"
complete -c seckill -n "__fish_seckill_using_subcommand status" -l redis-url -d 'Redis URL (redis://[:password@]host:port/[db])' -r
complete -c seckill -n "__fish_seckill_using_subcommand status" -l mysql-url -d 'MySQL URL (mysql://user:password@host:port/database) [default: mysql://seckill:***@127.0.0.1:13306/seckill]' -r
complete -c seckill -n "__fish_seckill_using_subcommand status" -l prefix -d 'Key prefix of every Redis key' -r
complete -c seckill -n "__fish_seckill_using_subcommand status" -l connect-timeout -d 'How long to wait for a server to accept a connection' -r
complete -c seckill -n "__fish_seckill_using_subcommand status" -l redis-password-file -d 'Read the Redis password from this file (one trailing newline is dropped), e.g. a systemd credential; the URL must then have none' -r -F
complete -c seckill -n "__fish_seckill_using_subcommand status" -l mysql-password-file -d 'Read the MySQL password from this file (one trailing newline is dropped), e.g. a systemd credential; the URL must then have none' -r -F
complete -c seckill -n "__fish_seckill_using_subcommand status" -l redis-ca-cert -d 'CA certificate (PEM) to trust for rediss:// URLs instead of the system\'s roots' -r -F
complete -c seckill -n "__fish_seckill_using_subcommand status" -l redis-client-cert -d 'Client certificate (PEM) for rediss:// with mutual TLS' -r -F
complete -c seckill -n "__fish_seckill_using_subcommand status" -l redis-client-key -d 'The client certificate\'s private key (PEM)' -r -F
complete -c seckill -n "__fish_seckill_using_subcommand status" -l mysql-ssl-mode -d 'MySQL TLS, as the mysql client\'s --ssl-mode: verify-ca checks the certificate\'s chain, verify-identity its host name too' -r -f -a "disabled\t''
preferred\t''
required\t''
verify-ca\t''
verify-identity\t''"
complete -c seckill -n "__fish_seckill_using_subcommand status" -l mysql-ca-cert -d 'CA certificate (PEM) to check the MySQL server\'s certificate against (verify-ca, verify-identity) instead of the built-in roots' -r -F
complete -c seckill -n "__fish_seckill_using_subcommand status" -l mysql-client-cert -d 'Client certificate (PEM) for MySQL with mutual TLS' -r -F
complete -c seckill -n "__fish_seckill_using_subcommand status" -l mysql-client-key -d 'The client certificate\'s private key (PEM)' -r -F
complete -c seckill -n "__fish_seckill_using_subcommand status" -s v -l verbose -d 'More log output on stderr (-v debug, -vv trace); RUST_LOG overrides'
complete -c seckill -n "__fish_seckill_using_subcommand status" -s q -l quiet -d 'Only errors on stderr'
complete -c seckill -n "__fish_seckill_using_subcommand status" -s h -l help -d 'Print help (see more with \'--help\')'
complete -c seckill -n "__fish_seckill_using_subcommand status" -s V -l version -d 'Print version'
complete -c seckill -n "__fish_seckill_using_subcommand voucher; and not __fish_seen_subcommand_from add update list help" -l redis-url -d 'Redis URL (redis://[:password@]host:port/[db])' -r
complete -c seckill -n "__fish_seckill_using_subcommand voucher; and not __fish_seen_subcommand_from add update list help" -l mysql-url -d 'MySQL URL (mysql://user:password@host:port/database) [default: mysql://seckill:***@127.0.0.1:13306/seckill]' -r
complete -c seckill -n "__fish_seckill_using_subcommand voucher; and not __fish_seen_subcommand_from add update list help" -l prefix -d 'Key prefix of every Redis key' -r
complete -c seckill -n "__fish_seckill_using_subcommand voucher; and not __fish_seen_subcommand_from add update list help" -l connect-timeout -d 'How long to wait for a server to accept a connection' -r
complete -c seckill -n "__fish_seckill_using_subcommand voucher; and not __fish_seen_subcommand_from add update list help" -l redis-password-file -d 'Read the Redis password from this file (one trailing newline is dropped), e.g. a systemd credential; the URL must then have none' -r -F
complete -c seckill -n "__fish_seckill_using_subcommand voucher; and not __fish_seen_subcommand_from add update list help" -l mysql-password-file -d 'Read the MySQL password from this file (one trailing newline is dropped), e.g. a systemd credential; the URL must then have none' -r -F
complete -c seckill -n "__fish_seckill_using_subcommand voucher; and not __fish_seen_subcommand_from add update list help" -l redis-ca-cert -d 'CA certificate (PEM) to trust for rediss:// URLs instead of the system\'s roots' -r -F
complete -c seckill -n "__fish_seckill_using_subcommand voucher; and not __fish_seen_subcommand_from add update list help" -l redis-client-cert -d 'Client certificate (PEM) for rediss:// with mutual TLS' -r -F
complete -c seckill -n "__fish_seckill_using_subcommand voucher; and not __fish_seen_subcommand_from add update list help" -l redis-client-key -d 'The client certificate\'s private key (PEM)' -r -F
complete -c seckill -n "__fish_seckill_using_subcommand voucher; and not __fish_seen_subcommand_from add update list help" -l mysql-ssl-mode -d 'MySQL TLS, as the mysql client\'s --ssl-mode: verify-ca checks the certificate\'s chain, verify-identity its host name too' -r -f -a "disabled\t''
preferred\t''
required\t''
verify-ca\t''
verify-identity\t''"
complete -c seckill -n "__fish_seckill_using_subcommand voucher; and not __fish_seen_subcommand_from add update list help" -l mysql-ca-cert -d 'CA certificate (PEM) to check the MySQL server\'s certificate against (verify-ca, verify-identity) instead of the built-in roots' -r -F
complete -c seckill -n "__fish_seckill_using_subcommand voucher; and not __fish_seen_subcommand_from add update list help" -l mysql-client-cert -d 'Client certificate (PEM) for MySQL with mutual TLS' -r -F
complete -c seckill -n "__fish_seckill_using_subcommand voucher; and not __fish_seen_subcommand_from add update list help" -l mysql-client-key -d 'The client certificate\'s private key (PEM)' -r -F
complete -c seckill -n "__fish_seckill_using_subcommand voucher; and not __fish_seen_subcommand_from add update list help" -s v -l verbose -d 'More log output on stderr (-v debug, -vv trace); RUST_LOG overrides'
complete -c seckill -n "__fish_seckill_using_subcommand voucher; and not __fish_seen_subcommand_from add update list help" -s q -l quiet -d 'Only errors on stderr'
complete -c seckill -n "__fish_seckill_using_subcommand voucher; and not __fish_seen_subcommand_from add update list help" -s h -l help -d 'Print help'
complete -c seckill -n "__fish_seckill_using_subcommand voucher; and not __fish_seen_subcommand_from add update list help" -s V -l version -d 'Print version'
complete -c seckill -n "__fish_seckill_using_subcommand voucher; and not __fish_seen_subcommand_from add update list help" -f -a "add" -d 'Add a voucher to MySQL (then `seckill preload` opens it at the gate)'
complete -c seckill -n "__fish_seckill_using_subcommand voucher; and not __fish_seen_subcommand_from add update list help" -f -a "update" -d 'Change a voucher\'s admission policy, in MySQL and at the gate at once'
complete -c seckill -n "__fish_seckill_using_subcommand voucher; and not __fish_seen_subcommand_from add update list help" -f -a "list" -d 'List vouchers: MySQL stock and orders beside the Redis gate\'s state'
complete -c seckill -n "__fish_seckill_using_subcommand voucher; and not __fish_seen_subcommand_from add update list help" -f -a "help" -d 'Print this message or the help of the given subcommand(s)'
complete -c seckill -n "__fish_seckill_using_subcommand voucher; and __fish_seen_subcommand_from add" -l id -d 'Voucher id (1..=9223372036854775807)' -r
complete -c seckill -n "__fish_seckill_using_subcommand voucher; and __fish_seen_subcommand_from add" -l stock -d 'Units for sale' -r
complete -c seckill -n "__fish_seckill_using_subcommand voucher; and __fish_seen_subcommand_from add" -l begin -d 'Sale opens: RFC 3339, `now`, or relative like `+10m`' -r
complete -c seckill -n "__fish_seckill_using_subcommand voucher; and __fish_seen_subcommand_from add" -l end -d 'Sale closes: RFC 3339, `now`, or relative like `+2h` [default: begin + 24h]' -r
complete -c seckill -n "__fish_seckill_using_subcommand voucher; and __fish_seen_subcommand_from add" -l pay-timeout -d 'Time a buyer has to pay before the unit is released' -r
complete -c seckill -n "__fish_seckill_using_subcommand voucher; and __fish_seen_subcommand_from add" -l title -d 'Title shown in listings' -r
complete -c seckill -n "__fish_seckill_using_subcommand voucher; and __fish_seen_subcommand_from add" -l user-rate -d 'At most N attempts per user in any one second at the gate (0: no limit)' -r
complete -c seckill -n "__fish_seckill_using_subcommand voucher; and __fish_seen_subcommand_from add" -l per-user-limit -d 'The most units one user may buy (one order of 1..=L units)' -r
complete -c seckill -n "__fish_seckill_using_subcommand voucher; and __fish_seen_subcommand_from add" -l waitlist-limit -d 'Once W requests wait, a sold-out attempt writes nothing (default: no cap)' -r
complete -c seckill -n "__fish_seckill_using_subcommand voucher; and __fish_seen_subcommand_from add" -l buckets -d 'Split the stock over N gates, each on a master of its own, so one voucher sells on N Redis masters (1: one gate)' -r
complete -c seckill -n "__fish_seckill_using_subcommand voucher; and __fish_seen_subcommand_from add" -l format -d 'Output format' -r -f -a "table\t'A table for people'
json\t'JSON for scripts'"
complete -c seckill -n "__fish_seckill_using_subcommand voucher; and __fish_seen_subcommand_from add" -l redis-url -d 'Redis URL (redis://[:password@]host:port/[db])' -r
complete -c seckill -n "__fish_seckill_using_subcommand voucher; and __fish_seen_subcommand_from add" -l mysql-url -d 'MySQL URL (mysql://user:password@host:port/database) [default: mysql://seckill:***@127.0.0.1:13306/seckill]' -r
complete -c seckill -n "__fish_seckill_using_subcommand voucher; and __fish_seen_subcommand_from add" -l prefix -d 'Key prefix of every Redis key' -r
complete -c seckill -n "__fish_seckill_using_subcommand voucher; and __fish_seen_subcommand_from add" -l connect-timeout -d 'How long to wait for a server to accept a connection' -r
complete -c seckill -n "__fish_seckill_using_subcommand voucher; and __fish_seen_subcommand_from add" -l redis-password-file -d 'Read the Redis password from this file (one trailing newline is dropped), e.g. a systemd credential; the URL must then have none' -r -F
complete -c seckill -n "__fish_seckill_using_subcommand voucher; and __fish_seen_subcommand_from add" -l mysql-password-file -d 'Read the MySQL password from this file (one trailing newline is dropped), e.g. a systemd credential; the URL must then have none' -r -F
complete -c seckill -n "__fish_seckill_using_subcommand voucher; and __fish_seen_subcommand_from add" -l redis-ca-cert -d 'CA certificate (PEM) to trust for rediss:// URLs instead of the system\'s roots' -r -F
complete -c seckill -n "__fish_seckill_using_subcommand voucher; and __fish_seen_subcommand_from add" -l redis-client-cert -d 'Client certificate (PEM) for rediss:// with mutual TLS' -r -F
complete -c seckill -n "__fish_seckill_using_subcommand voucher; and __fish_seen_subcommand_from add" -l redis-client-key -d 'The client certificate\'s private key (PEM)' -r -F
complete -c seckill -n "__fish_seckill_using_subcommand voucher; and __fish_seen_subcommand_from add" -l mysql-ssl-mode -d 'MySQL TLS, as the mysql client\'s --ssl-mode: verify-ca checks the certificate\'s chain, verify-identity its host name too' -r -f -a "disabled\t''
preferred\t''
required\t''
verify-ca\t''
verify-identity\t''"
complete -c seckill -n "__fish_seckill_using_subcommand voucher; and __fish_seen_subcommand_from add" -l mysql-ca-cert -d 'CA certificate (PEM) to check the MySQL server\'s certificate against (verify-ca, verify-identity) instead of the built-in roots' -r -F
complete -c seckill -n "__fish_seckill_using_subcommand voucher; and __fish_seen_subcommand_from add" -l mysql-client-cert -d 'Client certificate (PEM) for MySQL with mutual TLS' -r -F
complete -c seckill -n "__fish_seckill_using_subcommand voucher; and __fish_seen_subcommand_from add" -l mysql-client-key -d 'The client certificate\'s private key (PEM)' -r -F
complete -c seckill -n "__fish_seckill_using_subcommand voucher; and __fish_seen_subcommand_from add" -l require-token -d 'Admission needs a token issued for the user (`seckill token issue`)'
complete -c seckill -n "__fish_seckill_using_subcommand voucher; and __fish_seen_subcommand_from add" -s v -l verbose -d 'More log output on stderr (-v debug, -vv trace); RUST_LOG overrides'
complete -c seckill -n "__fish_seckill_using_subcommand voucher; and __fish_seen_subcommand_from add" -s q -l quiet -d 'Only errors on stderr'
complete -c seckill -n "__fish_seckill_using_subcommand voucher; and __fish_seen_subcommand_from add" -s h -l help -d 'Print help (see more with \'--help\')'
complete -c seckill -n "__fish_seckill_using_subcommand voucher; and __fish_seen_subcommand_from add" -s V -l version -d 'Print version'
complete -c seckill -n "__fish_seckill_using_subcommand voucher; and __fish_seen_subcommand_from update" -l id -d 'Voucher id' -r
complete -c seckill -n "__fish_seckill_using_subcommand voucher; and __fish_seen_subcommand_from update" -l user-rate -d 'At most N attempts per user in any one second at the gate (0: no limit)' -r
complete -c seckill -n "__fish_seckill_using_subcommand voucher; and __fish_seen_subcommand_from update" -l per-user-limit -d 'The most units one user may buy (one order of 1..=L units)' -r
complete -c seckill -n "__fish_seckill_using_subcommand voucher; and __fish_seen_subcommand_from update" -l waitlist-limit -d 'Once W requests wait, a sold-out attempt writes nothing' -r
complete -c seckill -n "__fish_seckill_using_subcommand voucher; and __fish_seen_subcommand_from update" -l buckets -d 'Split the stock over N gates (only before the first preload)' -r
complete -c seckill -n "__fish_seckill_using_subcommand voucher; and __fish_seen_subcommand_from update" -l format -d 'Output format' -r -f -a "table\t'A table for people'
json\t'JSON for scripts'"
complete -c seckill -n "__fish_seckill_using_subcommand voucher; and __fish_seen_subcommand_from update" -l redis-url -d 'Redis URL (redis://[:password@]host:port/[db])' -r
complete -c seckill -n "__fish_seckill_using_subcommand voucher; and __fish_seen_subcommand_from update" -l mysql-url -d 'MySQL URL (mysql://user:password@host:port/database) [default: mysql://seckill:***@127.0.0.1:13306/seckill]' -r
complete -c seckill -n "__fish_seckill_using_subcommand voucher; and __fish_seen_subcommand_from update" -l prefix -d 'Key prefix of every Redis key' -r
complete -c seckill -n "__fish_seckill_using_subcommand voucher; and __fish_seen_subcommand_from update" -l connect-timeout -d 'How long to wait for a server to accept a connection' -r
complete -c seckill -n "__fish_seckill_using_subcommand voucher; and __fish_seen_subcommand_from update" -l redis-password-file -d 'Read the Redis password from this file (one trailing newline is dropped), e.g. a systemd credential; the URL must then have none' -r -F
complete -c seckill -n "__fish_seckill_using_subcommand voucher; and __fish_seen_subcommand_from update" -l mysql-password-file -d 'Read the MySQL password from this file (one trailing newline is dropped), e.g. a systemd credential; the URL must then have none' -r -F
complete -c seckill -n "__fish_seckill_using_subcommand voucher; and __fish_seen_subcommand_from update" -l redis-ca-cert -d 'CA certificate (PEM) to trust for rediss:// URLs instead of the system\'s roots' -r -F
complete -c seckill -n "__fish_seckill_using_subcommand voucher; and __fish_seen_subcommand_from update" -l redis-client-cert -d 'Client certificate (PEM) for rediss:// with mutual TLS' -r -F
complete -c seckill -n "__fish_seckill_using_subcommand voucher; and __fish_seen_subcommand_from update" -l redis-client-key -d 'The client certificate\'s private key (PEM)' -r -F
complete -c seckill -n "__fish_seckill_using_subcommand voucher; and __fish_seen_subcommand_from update" -l mysql-ssl-mode -d 'MySQL TLS, as the mysql client\'s --ssl-mode: verify-ca checks the certificate\'s chain, verify-identity its host name too' -r -f -a "disabled\t''
preferred\t''
required\t''
verify-ca\t''
verify-identity\t''"
complete -c seckill -n "__fish_seckill_using_subcommand voucher; and __fish_seen_subcommand_from update" -l mysql-ca-cert -d 'CA certificate (PEM) to check the MySQL server\'s certificate against (verify-ca, verify-identity) instead of the built-in roots' -r -F
complete -c seckill -n "__fish_seckill_using_subcommand voucher; and __fish_seen_subcommand_from update" -l mysql-client-cert -d 'Client certificate (PEM) for MySQL with mutual TLS' -r -F
complete -c seckill -n "__fish_seckill_using_subcommand voucher; and __fish_seen_subcommand_from update" -l mysql-client-key -d 'The client certificate\'s private key (PEM)' -r -F
complete -c seckill -n "__fish_seckill_using_subcommand voucher; and __fish_seen_subcommand_from update" -l require-token -d 'Admission needs a token issued for the user'
complete -c seckill -n "__fish_seckill_using_subcommand voucher; and __fish_seen_subcommand_from update" -l no-require-token -d 'Admission needs no token'
complete -c seckill -n "__fish_seckill_using_subcommand voucher; and __fish_seen_subcommand_from update" -l no-waitlist-limit -d 'No cap on the waitlist'
complete -c seckill -n "__fish_seckill_using_subcommand voucher; and __fish_seen_subcommand_from update" -s v -l verbose -d 'More log output on stderr (-v debug, -vv trace); RUST_LOG overrides'
complete -c seckill -n "__fish_seckill_using_subcommand voucher; and __fish_seen_subcommand_from update" -s q -l quiet -d 'Only errors on stderr'
complete -c seckill -n "__fish_seckill_using_subcommand voucher; and __fish_seen_subcommand_from update" -s h -l help -d 'Print help (see more with \'--help\')'
complete -c seckill -n "__fish_seckill_using_subcommand voucher; and __fish_seen_subcommand_from update" -s V -l version -d 'Print version'
complete -c seckill -n "__fish_seckill_using_subcommand voucher; and __fish_seen_subcommand_from list" -l voucher -d 'Only these vouchers (repeatable)' -r
complete -c seckill -n "__fish_seckill_using_subcommand voucher; and __fish_seen_subcommand_from list" -l format -d 'Output format' -r -f -a "table\t'A table for people'
json\t'JSON for scripts'"
complete -c seckill -n "__fish_seckill_using_subcommand voucher; and __fish_seen_subcommand_from list" -l redis-url -d 'Redis URL (redis://[:password@]host:port/[db])' -r
complete -c seckill -n "__fish_seckill_using_subcommand voucher; and __fish_seen_subcommand_from list" -l mysql-url -d 'MySQL URL (mysql://user:password@host:port/database) [default: mysql://seckill:***@127.0.0.1:13306/seckill]' -r
complete -c seckill -n "__fish_seckill_using_subcommand voucher; and __fish_seen_subcommand_from list" -l prefix -d 'Key prefix of every Redis key' -r
complete -c seckill -n "__fish_seckill_using_subcommand voucher; and __fish_seen_subcommand_from list" -l connect-timeout -d 'How long to wait for a server to accept a connection' -r
complete -c seckill -n "__fish_seckill_using_subcommand voucher; and __fish_seen_subcommand_from list" -l redis-password-file -d 'Read the Redis password from this file (one trailing newline is dropped), e.g. a systemd credential; the URL must then have none' -r -F
complete -c seckill -n "__fish_seckill_using_subcommand voucher; and __fish_seen_subcommand_from list" -l mysql-password-file -d 'Read the MySQL password from this file (one trailing newline is dropped), e.g. a systemd credential; the URL must then have none' -r -F
complete -c seckill -n "__fish_seckill_using_subcommand voucher; and __fish_seen_subcommand_from list" -l redis-ca-cert -d 'CA certificate (PEM) to trust for rediss:// URLs instead of the system\'s roots' -r -F
complete -c seckill -n "__fish_seckill_using_subcommand voucher; and __fish_seen_subcommand_from list" -l redis-client-cert -d 'Client certificate (PEM) for rediss:// with mutual TLS' -r -F
complete -c seckill -n "__fish_seckill_using_subcommand voucher; and __fish_seen_subcommand_from list" -l redis-client-key -d 'The client certificate\'s private key (PEM)' -r -F
complete -c seckill -n "__fish_seckill_using_subcommand voucher; and __fish_seen_subcommand_from list" -l mysql-ssl-mode -d 'MySQL TLS, as the mysql client\'s --ssl-mode: verify-ca checks the certificate\'s chain, verify-identity its host name too' -r -f -a "disabled\t''
preferred\t''
required\t''
verify-ca\t''
verify-identity\t''"
complete -c seckill -n "__fish_seckill_using_subcommand voucher; and __fish_seen_subcommand_from list" -l mysql-ca-cert -d 'CA certificate (PEM) to check the MySQL server\'s certificate against (verify-ca, verify-identity) instead of the built-in roots' -r -F
complete -c seckill -n "__fish_seckill_using_subcommand voucher; and __fish_seen_subcommand_from list" -l mysql-client-cert -d 'Client certificate (PEM) for MySQL with mutual TLS' -r -F
complete -c seckill -n "__fish_seckill_using_subcommand voucher; and __fish_seen_subcommand_from list" -l mysql-client-key -d 'The client certificate\'s private key (PEM)' -r -F
complete -c seckill -n "__fish_seckill_using_subcommand voucher; and __fish_seen_subcommand_from list" -s v -l verbose -d 'More log output on stderr (-v debug, -vv trace); RUST_LOG overrides'
complete -c seckill -n "__fish_seckill_using_subcommand voucher; and __fish_seen_subcommand_from list" -s q -l quiet -d 'Only errors on stderr'
complete -c seckill -n "__fish_seckill_using_subcommand voucher; and __fish_seen_subcommand_from list" -s h -l help -d 'Print help (see more with \'--help\')'
complete -c seckill -n "__fish_seckill_using_subcommand voucher; and __fish_seen_subcommand_from list" -s V -l version -d 'Print version'
complete -c seckill -n "__fish_seckill_using_subcommand voucher; and __fish_seen_subcommand_from help" -f -a "add" -d 'Add a voucher to MySQL (then `seckill preload` opens it at the gate)'
complete -c seckill -n "__fish_seckill_using_subcommand voucher; and __fish_seen_subcommand_from help" -f -a "update" -d 'Change a voucher\'s admission policy, in MySQL and at the gate at once'
complete -c seckill -n "__fish_seckill_using_subcommand voucher; and __fish_seen_subcommand_from help" -f -a "list" -d 'List vouchers: MySQL stock and orders beside the Redis gate\'s state'
complete -c seckill -n "__fish_seckill_using_subcommand voucher; and __fish_seen_subcommand_from help" -f -a "help" -d 'Print this message or the help of the given subcommand(s)'
complete -c seckill -n "__fish_seckill_using_subcommand preload" -l voucher -d 'The voucher to load' -r
complete -c seckill -n "__fish_seckill_using_subcommand preload" -l format -d 'Output format' -r -f -a "table\t'A table for people'
json\t'JSON for scripts'"
complete -c seckill -n "__fish_seckill_using_subcommand preload" -l redis-url -d 'Redis URL (redis://[:password@]host:port/[db])' -r
complete -c seckill -n "__fish_seckill_using_subcommand preload" -l mysql-url -d 'MySQL URL (mysql://user:password@host:port/database) [default: mysql://seckill:***@127.0.0.1:13306/seckill]' -r
complete -c seckill -n "__fish_seckill_using_subcommand preload" -l prefix -d 'Key prefix of every Redis key' -r
complete -c seckill -n "__fish_seckill_using_subcommand preload" -l connect-timeout -d 'How long to wait for a server to accept a connection' -r
complete -c seckill -n "__fish_seckill_using_subcommand preload" -l redis-password-file -d 'Read the Redis password from this file (one trailing newline is dropped), e.g. a systemd credential; the URL must then have none' -r -F
complete -c seckill -n "__fish_seckill_using_subcommand preload" -l mysql-password-file -d 'Read the MySQL password from this file (one trailing newline is dropped), e.g. a systemd credential; the URL must then have none' -r -F
complete -c seckill -n "__fish_seckill_using_subcommand preload" -l redis-ca-cert -d 'CA certificate (PEM) to trust for rediss:// URLs instead of the system\'s roots' -r -F
complete -c seckill -n "__fish_seckill_using_subcommand preload" -l redis-client-cert -d 'Client certificate (PEM) for rediss:// with mutual TLS' -r -F
complete -c seckill -n "__fish_seckill_using_subcommand preload" -l redis-client-key -d 'The client certificate\'s private key (PEM)' -r -F
complete -c seckill -n "__fish_seckill_using_subcommand preload" -l mysql-ssl-mode -d 'MySQL TLS, as the mysql client\'s --ssl-mode: verify-ca checks the certificate\'s chain, verify-identity its host name too' -r -f -a "disabled\t''
preferred\t''
required\t''
verify-ca\t''
verify-identity\t''"
complete -c seckill -n "__fish_seckill_using_subcommand preload" -l mysql-ca-cert -d 'CA certificate (PEM) to check the MySQL server\'s certificate against (verify-ca, verify-identity) instead of the built-in roots' -r -F
complete -c seckill -n "__fish_seckill_using_subcommand preload" -l mysql-client-cert -d 'Client certificate (PEM) for MySQL with mutual TLS' -r -F
complete -c seckill -n "__fish_seckill_using_subcommand preload" -l mysql-client-key -d 'The client certificate\'s private key (PEM)' -r -F
complete -c seckill -n "__fish_seckill_using_subcommand preload" -l all -d 'Load every voucher in MySQL'
complete -c seckill -n "__fish_seckill_using_subcommand preload" -l force -d 'Load even while orders are in flight (this can re-admit sold units; prefer `seckill reconcile`)'
complete -c seckill -n "__fish_seckill_using_subcommand preload" -s v -l verbose -d 'More log output on stderr (-v debug, -vv trace); RUST_LOG overrides'
complete -c seckill -n "__fish_seckill_using_subcommand preload" -s q -l quiet -d 'Only errors on stderr'
complete -c seckill -n "__fish_seckill_using_subcommand preload" -s h -l help -d 'Print help (see more with \'--help\')'
complete -c seckill -n "__fish_seckill_using_subcommand preload" -s V -l version -d 'Print version'
complete -c seckill -n "__fish_seckill_using_subcommand buy" -l voucher -d 'Voucher id' -r
complete -c seckill -n "__fish_seckill_using_subcommand buy" -l user -d 'User id' -r
complete -c seckill -n "__fish_seckill_using_subcommand buy" -l token -d 'The user\'s admission token (`seckill token issue`), for a voucher that requires one' -r
complete -c seckill -n "__fish_seckill_using_subcommand buy" -l quantity -d 'Units to buy, all or none (1 ..= the voucher\'s per-user limit)' -r
complete -c seckill -n "__fish_seckill_using_subcommand buy" -l idempotency-key -d 'An idempotency key (1 to 255 printable ASCII characters): run again with the same key and arguments, the command gives the first run\'s outcome (and exit code) again instead of buying anew' -r
complete -c seckill -n "__fish_seckill_using_subcommand buy" -l idempotency-ttl -d 'How long --idempotency-key\'s outcome is kept (1s ..= 30days)' -r
complete -c seckill -n "__fish_seckill_using_subcommand buy" -l client-reference -d 'Your own name for this purchase (1 to 64 printable ASCII characters), kept with the order, also when the request waits in line first' -r
complete -c seckill -n "__fish_seckill_using_subcommand buy" -l wait-replicas -d 'After a success, wait until N replicas of the voucher\'s master have it (a failover to one of them then keeps it) [default: no wait]' -r
complete -c seckill -n "__fish_seckill_using_subcommand buy" -l wait-timeout -d 'The longest --wait-replicas waits before giving up (the admission stands either way)' -r
complete -c seckill -n "__fish_seckill_using_subcommand buy" -l node-id -d 'Snowflake node id (0..=1023), leased from Redis: refused while another live process holds it [default: a free one, leased]' -r
complete -c seckill -n "__fish_seckill_using_subcommand buy" -l format -d 'Output format' -r -f -a "table\t'A table for people'
json\t'JSON for scripts'"
complete -c seckill -n "__fish_seckill_using_subcommand buy" -l redis-url -d 'Redis URL (redis://[:password@]host:port/[db])' -r
complete -c seckill -n "__fish_seckill_using_subcommand buy" -l mysql-url -d 'MySQL URL (mysql://user:password@host:port/database) [default: mysql://seckill:***@127.0.0.1:13306/seckill]' -r
complete -c seckill -n "__fish_seckill_using_subcommand buy" -l prefix -d 'Key prefix of every Redis key' -r
complete -c seckill -n "__fish_seckill_using_subcommand buy" -l connect-timeout -d 'How long to wait for a server to accept a connection' -r
complete -c seckill -n "__fish_seckill_using_subcommand buy" -l redis-password-file -d 'Read the Redis password from this file (one trailing newline is dropped), e.g. a systemd credential; the URL must then have none' -r -F
complete -c seckill -n "__fish_seckill_using_subcommand buy" -l mysql-password-file -d 'Read the MySQL password from this file (one trailing newline is dropped), e.g. a systemd credential; the URL must then have none' -r -F
complete -c seckill -n "__fish_seckill_using_subcommand buy" -l redis-ca-cert -d 'CA certificate (PEM) to trust for rediss:// URLs instead of the system\'s roots' -r -F
complete -c seckill -n "__fish_seckill_using_subcommand buy" -l redis-client-cert -d 'Client certificate (PEM) for rediss:// with mutual TLS' -r -F
complete -c seckill -n "__fish_seckill_using_subcommand buy" -l redis-client-key -d 'The client certificate\'s private key (PEM)' -r -F
complete -c seckill -n "__fish_seckill_using_subcommand buy" -l mysql-ssl-mode -d 'MySQL TLS, as the mysql client\'s --ssl-mode: verify-ca checks the certificate\'s chain, verify-identity its host name too' -r -f -a "disabled\t''
preferred\t''
required\t''
verify-ca\t''
verify-identity\t''"
complete -c seckill -n "__fish_seckill_using_subcommand buy" -l mysql-ca-cert -d 'CA certificate (PEM) to check the MySQL server\'s certificate against (verify-ca, verify-identity) instead of the built-in roots' -r -F
complete -c seckill -n "__fish_seckill_using_subcommand buy" -l mysql-client-cert -d 'Client certificate (PEM) for MySQL with mutual TLS' -r -F
complete -c seckill -n "__fish_seckill_using_subcommand buy" -l mysql-client-key -d 'The client certificate\'s private key (PEM)' -r -F
complete -c seckill -n "__fish_seckill_using_subcommand buy" -s v -l verbose -d 'More log output on stderr (-v debug, -vv trace); RUST_LOG overrides'
complete -c seckill -n "__fish_seckill_using_subcommand buy" -s q -l quiet -d 'Only errors on stderr'
complete -c seckill -n "__fish_seckill_using_subcommand buy" -s h -l help -d 'Print help (see more with \'--help\')'
complete -c seckill -n "__fish_seckill_using_subcommand buy" -s V -l version -d 'Print version'
complete -c seckill -n "__fish_seckill_using_subcommand bench" -l voucher -d 'Voucher id (preloaded)' -r
complete -c seckill -n "__fish_seckill_using_subcommand bench" -l users -d 'Distinct users; attempt i is made by user (user-offset + i mod users + 1)' -r
complete -c seckill -n "__fish_seckill_using_subcommand bench" -l user-offset -d 'First user id is user-offset + 1' -r
complete -c seckill -n "__fish_seckill_using_subcommand bench" -l attempts -d 'Admission attempts in all' -r
complete -c seckill -n "__fish_seckill_using_subcommand bench" -l concurrency -d 'Attempts in flight at once' -r
complete -c seckill -n "__fish_seckill_using_subcommand bench" -l connections -d 'Redis connections the attempts are spread over' -r
complete -c seckill -n "__fish_seckill_using_subcommand bench" -l quantity -d 'Units per attempt: K, or a range K-M drawn per attempt' -r
complete -c seckill -n "__fish_seckill_using_subcommand bench" -l wait-replicas -d 'After a success, wait until N replicas of the voucher\'s master have it (a failover to one of them then keeps it) [default: no wait]' -r
complete -c seckill -n "__fish_seckill_using_subcommand bench" -l wait-timeout -d 'The longest --wait-replicas waits before giving up (the admission stands either way)' -r
complete -c seckill -n "__fish_seckill_using_subcommand bench" -l node-id -d 'Snowflake node id (0..=1023), leased from Redis: refused while another live process holds it [default: a free one, leased]' -r
complete -c seckill -n "__fish_seckill_using_subcommand bench" -l format -d 'Output format' -r -f -a "table\t'A table for people'
json\t'JSON for scripts'"
complete -c seckill -n "__fish_seckill_using_subcommand bench" -l redis-url -d 'Redis URL (redis://[:password@]host:port/[db])' -r
complete -c seckill -n "__fish_seckill_using_subcommand bench" -l mysql-url -d 'MySQL URL (mysql://user:password@host:port/database) [default: mysql://seckill:***@127.0.0.1:13306/seckill]' -r
complete -c seckill -n "__fish_seckill_using_subcommand bench" -l prefix -d 'Key prefix of every Redis key' -r
complete -c seckill -n "__fish_seckill_using_subcommand bench" -l connect-timeout -d 'How long to wait for a server to accept a connection' -r
complete -c seckill -n "__fish_seckill_using_subcommand bench" -l redis-password-file -d 'Read the Redis password from this file (one trailing newline is dropped), e.g. a systemd credential; the URL must then have none' -r -F
complete -c seckill -n "__fish_seckill_using_subcommand bench" -l mysql-password-file -d 'Read the MySQL password from this file (one trailing newline is dropped), e.g. a systemd credential; the URL must then have none' -r -F
complete -c seckill -n "__fish_seckill_using_subcommand bench" -l redis-ca-cert -d 'CA certificate (PEM) to trust for rediss:// URLs instead of the system\'s roots' -r -F
complete -c seckill -n "__fish_seckill_using_subcommand bench" -l redis-client-cert -d 'Client certificate (PEM) for rediss:// with mutual TLS' -r -F
complete -c seckill -n "__fish_seckill_using_subcommand bench" -l redis-client-key -d 'The client certificate\'s private key (PEM)' -r -F
complete -c seckill -n "__fish_seckill_using_subcommand bench" -l mysql-ssl-mode -d 'MySQL TLS, as the mysql client\'s --ssl-mode: verify-ca checks the certificate\'s chain, verify-identity its host name too' -r -f -a "disabled\t''
preferred\t''
required\t''
verify-ca\t''
verify-identity\t''"
complete -c seckill -n "__fish_seckill_using_subcommand bench" -l mysql-ca-cert -d 'CA certificate (PEM) to check the MySQL server\'s certificate against (verify-ca, verify-identity) instead of the built-in roots' -r -F
complete -c seckill -n "__fish_seckill_using_subcommand bench" -l mysql-client-cert -d 'Client certificate (PEM) for MySQL with mutual TLS' -r -F
complete -c seckill -n "__fish_seckill_using_subcommand bench" -l mysql-client-key -d 'The client certificate\'s private key (PEM)' -r -F
complete -c seckill -n "__fish_seckill_using_subcommand bench" -l tokens -d 'Issue an admission token to every user first (timed apart from the attempts) and attempt with it'
complete -c seckill -n "__fish_seckill_using_subcommand bench" -s v -l verbose -d 'More log output on stderr (-v debug, -vv trace); RUST_LOG overrides'
complete -c seckill -n "__fish_seckill_using_subcommand bench" -s q -l quiet -d 'Only errors on stderr'
complete -c seckill -n "__fish_seckill_using_subcommand bench" -s h -l help -d 'Print help (see more with \'--help\')'
complete -c seckill -n "__fish_seckill_using_subcommand bench" -s V -l version -d 'Print version'
complete -c seckill -n "__fish_seckill_using_subcommand token; and not __fish_seen_subcommand_from issue help" -l redis-url -d 'Redis URL (redis://[:password@]host:port/[db])' -r
complete -c seckill -n "__fish_seckill_using_subcommand token; and not __fish_seen_subcommand_from issue help" -l mysql-url -d 'MySQL URL (mysql://user:password@host:port/database) [default: mysql://seckill:***@127.0.0.1:13306/seckill]' -r
complete -c seckill -n "__fish_seckill_using_subcommand token; and not __fish_seen_subcommand_from issue help" -l prefix -d 'Key prefix of every Redis key' -r
complete -c seckill -n "__fish_seckill_using_subcommand token; and not __fish_seen_subcommand_from issue help" -l connect-timeout -d 'How long to wait for a server to accept a connection' -r
complete -c seckill -n "__fish_seckill_using_subcommand token; and not __fish_seen_subcommand_from issue help" -l redis-password-file -d 'Read the Redis password from this file (one trailing newline is dropped), e.g. a systemd credential; the URL must then have none' -r -F
complete -c seckill -n "__fish_seckill_using_subcommand token; and not __fish_seen_subcommand_from issue help" -l mysql-password-file -d 'Read the MySQL password from this file (one trailing newline is dropped), e.g. a systemd credential; the URL must then have none' -r -F
complete -c seckill -n "__fish_seckill_using_subcommand token; and not __fish_seen_subcommand_from issue help" -l redis-ca-cert -d 'CA certificate (PEM) to trust for rediss:// URLs instead of the system\'s roots' -r -F
complete -c seckill -n "__fish_seckill_using_subcommand token; and not __fish_seen_subcommand_from issue help" -l redis-client-cert -d 'Client certificate (PEM) for rediss:// with mutual TLS' -r -F
complete -c seckill -n "__fish_seckill_using_subcommand token; and not __fish_seen_subcommand_from issue help" -l redis-client-key -d 'The client certificate\'s private key (PEM)' -r -F
complete -c seckill -n "__fish_seckill_using_subcommand token; and not __fish_seen_subcommand_from issue help" -l mysql-ssl-mode -d 'MySQL TLS, as the mysql client\'s --ssl-mode: verify-ca checks the certificate\'s chain, verify-identity its host name too' -r -f -a "disabled\t''
preferred\t''
required\t''
verify-ca\t''
verify-identity\t''"
complete -c seckill -n "__fish_seckill_using_subcommand token; and not __fish_seen_subcommand_from issue help" -l mysql-ca-cert -d 'CA certificate (PEM) to check the MySQL server\'s certificate against (verify-ca, verify-identity) instead of the built-in roots' -r -F
complete -c seckill -n "__fish_seckill_using_subcommand token; and not __fish_seen_subcommand_from issue help" -l mysql-client-cert -d 'Client certificate (PEM) for MySQL with mutual TLS' -r -F
complete -c seckill -n "__fish_seckill_using_subcommand token; and not __fish_seen_subcommand_from issue help" -l mysql-client-key -d 'The client certificate\'s private key (PEM)' -r -F
complete -c seckill -n "__fish_seckill_using_subcommand token; and not __fish_seen_subcommand_from issue help" -s v -l verbose -d 'More log output on stderr (-v debug, -vv trace); RUST_LOG overrides'
complete -c seckill -n "__fish_seckill_using_subcommand token; and not __fish_seen_subcommand_from issue help" -s q -l quiet -d 'Only errors on stderr'
complete -c seckill -n "__fish_seckill_using_subcommand token; and not __fish_seen_subcommand_from issue help" -s h -l help -d 'Print help'
complete -c seckill -n "__fish_seckill_using_subcommand token; and not __fish_seen_subcommand_from issue help" -s V -l version -d 'Print version'
complete -c seckill -n "__fish_seckill_using_subcommand token; and not __fish_seen_subcommand_from issue help" -f -a "issue" -d 'Issue a user\'s admission token for a voucher that requires one'
complete -c seckill -n "__fish_seckill_using_subcommand token; and not __fish_seen_subcommand_from issue help" -f -a "help" -d 'Print this message or the help of the given subcommand(s)'
complete -c seckill -n "__fish_seckill_using_subcommand token; and __fish_seen_subcommand_from issue" -l voucher -d 'Voucher id' -r
complete -c seckill -n "__fish_seckill_using_subcommand token; and __fish_seen_subcommand_from issue" -l user -d 'User id' -r
complete -c seckill -n "__fish_seckill_using_subcommand token; and __fish_seen_subcommand_from issue" -l ttl -d 'How long the token stays valid (at most 24h); issuing again replaces it' -r
complete -c seckill -n "__fish_seckill_using_subcommand token; and __fish_seen_subcommand_from issue" -l format -d 'Output format' -r -f -a "table\t'A table for people'
json\t'JSON for scripts'"
complete -c seckill -n "__fish_seckill_using_subcommand token; and __fish_seen_subcommand_from issue" -l redis-url -d 'Redis URL (redis://[:password@]host:port/[db])' -r
complete -c seckill -n "__fish_seckill_using_subcommand token; and __fish_seen_subcommand_from issue" -l mysql-url -d 'MySQL URL (mysql://user:password@host:port/database) [default: mysql://seckill:***@127.0.0.1:13306/seckill]' -r
complete -c seckill -n "__fish_seckill_using_subcommand token; and __fish_seen_subcommand_from issue" -l prefix -d 'Key prefix of every Redis key' -r
complete -c seckill -n "__fish_seckill_using_subcommand token; and __fish_seen_subcommand_from issue" -l connect-timeout -d 'How long to wait for a server to accept a connection' -r
complete -c seckill -n "__fish_seckill_using_subcommand token; and __fish_seen_subcommand_from issue" -l redis-password-file -d 'Read the Redis password from this file (one trailing newline is dropped), e.g. a systemd credential; the URL must then have none' -r -F
complete -c seckill -n "__fish_seckill_using_subcommand token; and __fish_seen_subcommand_from issue" -l mysql-password-file -d 'Read the MySQL password from this file (one trailing newline is dropped), e.g. a systemd credential; the URL must then have none' -r -F
complete -c seckill -n "__fish_seckill_using_subcommand token; and __fish_seen_subcommand_from issue" -l redis-ca-cert -d 'CA certificate (PEM) to trust for rediss:// URLs instead of the system\'s roots' -r -F
complete -c seckill -n "__fish_seckill_using_subcommand token; and __fish_seen_subcommand_from issue" -l redis-client-cert -d 'Client certificate (PEM) for rediss:// with mutual TLS' -r -F
complete -c seckill -n "__fish_seckill_using_subcommand token; and __fish_seen_subcommand_from issue" -l redis-client-key -d 'The client certificate\'s private key (PEM)' -r -F
complete -c seckill -n "__fish_seckill_using_subcommand token; and __fish_seen_subcommand_from issue" -l mysql-ssl-mode -d 'MySQL TLS, as the mysql client\'s --ssl-mode: verify-ca checks the certificate\'s chain, verify-identity its host name too' -r -f -a "disabled\t''
preferred\t''
required\t''
verify-ca\t''
verify-identity\t''"
complete -c seckill -n "__fish_seckill_using_subcommand token; and __fish_seen_subcommand_from issue" -l mysql-ca-cert -d 'CA certificate (PEM) to check the MySQL server\'s certificate against (verify-ca, verify-identity) instead of the built-in roots' -r -F
complete -c seckill -n "__fish_seckill_using_subcommand token; and __fish_seen_subcommand_from issue" -l mysql-client-cert -d 'Client certificate (PEM) for MySQL with mutual TLS' -r -F
complete -c seckill -n "__fish_seckill_using_subcommand token; and __fish_seen_subcommand_from issue" -l mysql-client-key -d 'The client certificate\'s private key (PEM)' -r -F
complete -c seckill -n "__fish_seckill_using_subcommand token; and __fish_seen_subcommand_from issue" -s v -l verbose -d 'More log output on stderr (-v debug, -vv trace); RUST_LOG overrides'
complete -c seckill -n "__fish_seckill_using_subcommand token; and __fish_seen_subcommand_from issue" -s q -l quiet -d 'Only errors on stderr'
complete -c seckill -n "__fish_seckill_using_subcommand token; and __fish_seen_subcommand_from issue" -s h -l help -d 'Print help (see more with \'--help\')'
complete -c seckill -n "__fish_seckill_using_subcommand token; and __fish_seen_subcommand_from issue" -s V -l version -d 'Print version'
complete -c seckill -n "__fish_seckill_using_subcommand token; and __fish_seen_subcommand_from help" -f -a "issue" -d 'Issue a user\'s admission token for a voucher that requires one'
complete -c seckill -n "__fish_seckill_using_subcommand token; and __fish_seen_subcommand_from help" -f -a "help" -d 'Print this message or the help of the given subcommand(s)'
complete -c seckill -n "__fish_seckill_using_subcommand worker" -l consumer -d 'Consumer name in the group, stable per instance [default: host-pid]' -r
complete -c seckill -n "__fish_seckill_using_subcommand worker" -l batch -d 'Entries read and persisted per batch (one MySQL transaction)' -r
complete -c seckill -n "__fish_seckill_using_subcommand worker" -l max-batch -d 'Largest batch while a backlog lasts: reads that come back full double the next one\'s size up to this (--batch or less: no growth)' -r
complete -c seckill -n "__fish_seckill_using_subcommand worker" -l block -d 'Longest wait of one blocking read for new entries' -r
complete -c seckill -n "__fish_seckill_using_subcommand worker" -l claim-idle -d 'Reclaim entries another consumer has left pending this long' -r
complete -c seckill -n "__fish_seckill_using_subcommand worker" -l max-deliveries -d 'Dead-letter a message that cannot be persisted after this many deliveries' -r
complete -c seckill -n "__fish_seckill_using_subcommand worker" -l lock-lease -d 'Lease of the per-(user, voucher) locks, renewed while a batch runs' -r
complete -c seckill -n "__fish_seckill_using_subcommand worker" -l mysql-timeout -d 'Longest a batch\'s (or a cancellation\'s) MySQL transaction may take, from its connection to its COMMIT\'s answer; past it, it is abandoned: its connection thrown away, its session ended, its batch left for another worker (more than half --lock-lease)' -r
complete -c seckill -n "__fish_seckill_using_subcommand worker" -l keep -d 'Trim acknowledged stream entries older than this' -r
complete -c seckill -n "__fish_seckill_using_subcommand worker" -l lanes -d 'Batches in hand at once (one reads and locks while another commits)' -r
complete -c seckill -n "__fish_seckill_using_subcommand worker" -l deadline-lease -d 'A claimed payment deadline comes back after this long if its claimer died' -r
complete -c seckill -n "__fish_seckill_using_subcommand worker" -l sweep-every -d 'How often MySQL is swept for pending orders whose deadline Redis lost' -r
complete -c seckill -n "__fish_seckill_using_subcommand worker" -l sweep-grace -d 'How far past its deadline a pending order must be for the sweep to cancel it' -r
complete -c seckill -n "__fish_seckill_using_subcommand worker" -l gate-check -d 'How often the gates are checked for writes Redis lost that MySQL holds (then paused, rebuilt from MySQL and reopened); 0s: never' -r
complete -c seckill -n "__fish_seckill_using_subcommand worker" -l node-id -d 'Snowflake node id (0..=1023), leased from Redis: refused while another live process holds it [default: a free one, leased]' -r
complete -c seckill -n "__fish_seckill_using_subcommand worker" -l metrics-addr -d 'Serve Prometheus metrics at http://ADDR/metrics (e.g. 127.0.0.1:9464)' -r
complete -c seckill -n "__fish_seckill_using_subcommand worker" -l format -d 'Output format' -r -f -a "table\t'A table for people'
json\t'JSON for scripts'"
complete -c seckill -n "__fish_seckill_using_subcommand worker" -l redis-url -d 'Redis URL (redis://[:password@]host:port/[db])' -r
complete -c seckill -n "__fish_seckill_using_subcommand worker" -l mysql-url -d 'MySQL URL (mysql://user:password@host:port/database) [default: mysql://seckill:***@127.0.0.1:13306/seckill]' -r
complete -c seckill -n "__fish_seckill_using_subcommand worker" -l prefix -d 'Key prefix of every Redis key' -r
complete -c seckill -n "__fish_seckill_using_subcommand worker" -l connect-timeout -d 'How long to wait for a server to accept a connection' -r
complete -c seckill -n "__fish_seckill_using_subcommand worker" -l redis-password-file -d 'Read the Redis password from this file (one trailing newline is dropped), e.g. a systemd credential; the URL must then have none' -r -F
complete -c seckill -n "__fish_seckill_using_subcommand worker" -l mysql-password-file -d 'Read the MySQL password from this file (one trailing newline is dropped), e.g. a systemd credential; the URL must then have none' -r -F
complete -c seckill -n "__fish_seckill_using_subcommand worker" -l redis-ca-cert -d 'CA certificate (PEM) to trust for rediss:// URLs instead of the system\'s roots' -r -F
complete -c seckill -n "__fish_seckill_using_subcommand worker" -l redis-client-cert -d 'Client certificate (PEM) for rediss:// with mutual TLS' -r -F
complete -c seckill -n "__fish_seckill_using_subcommand worker" -l redis-client-key -d 'The client certificate\'s private key (PEM)' -r -F
complete -c seckill -n "__fish_seckill_using_subcommand worker" -l mysql-ssl-mode -d 'MySQL TLS, as the mysql client\'s --ssl-mode: verify-ca checks the certificate\'s chain, verify-identity its host name too' -r -f -a "disabled\t''
preferred\t''
required\t''
verify-ca\t''
verify-identity\t''"
complete -c seckill -n "__fish_seckill_using_subcommand worker" -l mysql-ca-cert -d 'CA certificate (PEM) to check the MySQL server\'s certificate against (verify-ca, verify-identity) instead of the built-in roots' -r -F
complete -c seckill -n "__fish_seckill_using_subcommand worker" -l mysql-client-cert -d 'Client certificate (PEM) for MySQL with mutual TLS' -r -F
complete -c seckill -n "__fish_seckill_using_subcommand worker" -l mysql-client-key -d 'The client certificate\'s private key (PEM)' -r -F
complete -c seckill -n "__fish_seckill_using_subcommand worker" -l until-idle -d 'Exit 0 once no voucher has undelivered or pending entries (for cron)'
complete -c seckill -n "__fish_seckill_using_subcommand worker" -s v -l verbose -d 'More log output on stderr (-v debug, -vv trace); RUST_LOG overrides'
complete -c seckill -n "__fish_seckill_using_subcommand worker" -s q -l quiet -d 'Only errors on stderr'
complete -c seckill -n "__fish_seckill_using_subcommand worker" -s h -l help -d 'Print help (see more with \'--help\')'
complete -c seckill -n "__fish_seckill_using_subcommand worker" -s V -l version -d 'Print version'
complete -c seckill -n "__fish_seckill_using_subcommand serve" -l listen -d 'Address to listen on (a non-loopback one needs --api-key-file)' -r
complete -c seckill -n "__fish_seckill_using_subcommand serve" -l api-key-file -d 'File of API keys, one per line (blank lines and # comments skipped); every /v1 request must carry one as `Authorization: Bearer <key>`' -r -F
complete -c seckill -n "__fish_seckill_using_subcommand serve" -l max-in-flight -d 'Requests handled at once; more are answered 503 at once' -r
complete -c seckill -n "__fish_seckill_using_subcommand serve" -l request-timeout -d 'A request not answered within this is answered 503 (outcome unknown)' -r
complete -c seckill -n "__fish_seckill_using_subcommand serve" -l header-timeout -d 'A connection is closed when a request\'s head has not arrived within this of its opening, or of its first byte after an answer' -r
complete -c seckill -n "__fish_seckill_using_subcommand serve" -l idle-timeout -d 'A keep-alive connection with no request for this long is closed (keep it above a load balancer\'s idle timeout: 60 s on most)' -r
complete -c seckill -n "__fish_seckill_using_subcommand serve" -l max-connections -d 'Connections open at once (fewer if the descriptor limit leaves less room); at the cap the longest idle or slow ones are closed for newcomers' -r
complete -c seckill -n "__fish_seckill_using_subcommand serve" -l drain -d 'On SIGTERM/SIGINT, requests in flight get this long to finish' -r
complete -c seckill -n "__fish_seckill_using_subcommand serve" -l redis-connections -d 'Multiplexed Redis connections shared by all requests' -r
complete -c seckill -n "__fish_seckill_using_subcommand serve" -l tls-cert -d 'Serve HTTPS with this certificate chain (PEM; needs --tls-key)' -r -F
complete -c seckill -n "__fish_seckill_using_subcommand serve" -l tls-key -d 'The private key of --tls-cert (PEM)' -r -F
complete -c seckill -n "__fish_seckill_using_subcommand serve" -l metrics-addr -d 'Serve Prometheus metrics at http://ADDR/metrics (e.g. 127.0.0.1:9465) and not on --listen, which then answers 404 there' -r
complete -c seckill -n "__fish_seckill_using_subcommand serve" -l idempotency-ttl -d 'How long an Idempotency-Key\'s answer is kept for resends (1s ..= 30days)' -r
complete -c seckill -n "__fish_seckill_using_subcommand serve" -l wait-replicas -d 'After a success, wait until N replicas of the voucher\'s master have it (a failover to one of them then keeps it) [default: no wait]' -r
complete -c seckill -n "__fish_seckill_using_subcommand serve" -l wait-timeout -d 'The longest --wait-replicas waits before giving up (the admission stands either way)' -r
complete -c seckill -n "__fish_seckill_using_subcommand serve" -l node-id -d 'Snowflake node id (0..=1023), leased from Redis: refused while another live process holds it [default: a free one, leased]' -r
complete -c seckill -n "__fish_seckill_using_subcommand serve" -l redis-url -d 'Redis URL (redis://[:password@]host:port/[db])' -r
complete -c seckill -n "__fish_seckill_using_subcommand serve" -l mysql-url -d 'MySQL URL (mysql://user:password@host:port/database) [default: mysql://seckill:***@127.0.0.1:13306/seckill]' -r
complete -c seckill -n "__fish_seckill_using_subcommand serve" -l prefix -d 'Key prefix of every Redis key' -r
complete -c seckill -n "__fish_seckill_using_subcommand serve" -l connect-timeout -d 'How long to wait for a server to accept a connection' -r
complete -c seckill -n "__fish_seckill_using_subcommand serve" -l redis-password-file -d 'Read the Redis password from this file (one trailing newline is dropped), e.g. a systemd credential; the URL must then have none' -r -F
complete -c seckill -n "__fish_seckill_using_subcommand serve" -l mysql-password-file -d 'Read the MySQL password from this file (one trailing newline is dropped), e.g. a systemd credential; the URL must then have none' -r -F
complete -c seckill -n "__fish_seckill_using_subcommand serve" -l redis-ca-cert -d 'CA certificate (PEM) to trust for rediss:// URLs instead of the system\'s roots' -r -F
complete -c seckill -n "__fish_seckill_using_subcommand serve" -l redis-client-cert -d 'Client certificate (PEM) for rediss:// with mutual TLS' -r -F
complete -c seckill -n "__fish_seckill_using_subcommand serve" -l redis-client-key -d 'The client certificate\'s private key (PEM)' -r -F
complete -c seckill -n "__fish_seckill_using_subcommand serve" -l mysql-ssl-mode -d 'MySQL TLS, as the mysql client\'s --ssl-mode: verify-ca checks the certificate\'s chain, verify-identity its host name too' -r -f -a "disabled\t''
preferred\t''
required\t''
verify-ca\t''
verify-identity\t''"
complete -c seckill -n "__fish_seckill_using_subcommand serve" -l mysql-ca-cert -d 'CA certificate (PEM) to check the MySQL server\'s certificate against (verify-ca, verify-identity) instead of the built-in roots' -r -F
complete -c seckill -n "__fish_seckill_using_subcommand serve" -l mysql-client-cert -d 'Client certificate (PEM) for MySQL with mutual TLS' -r -F
complete -c seckill -n "__fish_seckill_using_subcommand serve" -l mysql-client-key -d 'The client certificate\'s private key (PEM)' -r -F
complete -c seckill -n "__fish_seckill_using_subcommand serve" -s v -l verbose -d 'More log output on stderr (-v debug, -vv trace); RUST_LOG overrides'
complete -c seckill -n "__fish_seckill_using_subcommand serve" -s q -l quiet -d 'Only errors on stderr'
complete -c seckill -n "__fish_seckill_using_subcommand serve" -s h -l help -d 'Print help'
complete -c seckill -n "__fish_seckill_using_subcommand serve" -s V -l version -d 'Print version'
complete -c seckill -n "__fish_seckill_using_subcommand pending" -l voucher -d 'Show this voucher\'s pending entries and dead letters' -r
complete -c seckill -n "__fish_seckill_using_subcommand pending" -l limit -d 'How many pending entries and dead letters to list' -r
complete -c seckill -n "__fish_seckill_using_subcommand pending" -l entry -d 'A dead-letter id to requeue (repeatable)' -r
complete -c seckill -n "__fish_seckill_using_subcommand pending" -l format -d 'Output format' -r -f -a "table\t'A table for people'
json\t'JSON for scripts'"
complete -c seckill -n "__fish_seckill_using_subcommand pending" -l redis-url -d 'Redis URL (redis://[:password@]host:port/[db])' -r
complete -c seckill -n "__fish_seckill_using_subcommand pending" -l mysql-url -d 'MySQL URL (mysql://user:password@host:port/database) [default: mysql://seckill:***@127.0.0.1:13306/seckill]' -r
complete -c seckill -n "__fish_seckill_using_subcommand pending" -l prefix -d 'Key prefix of every Redis key' -r
complete -c seckill -n "__fish_seckill_using_subcommand pending" -l connect-timeout -d 'How long to wait for a server to accept a connection' -r
complete -c seckill -n "__fish_seckill_using_subcommand pending" -l redis-password-file -d 'Read the Redis password from this file (one trailing newline is dropped), e.g. a systemd credential; the URL must then have none' -r -F
complete -c seckill -n "__fish_seckill_using_subcommand pending" -l mysql-password-file -d 'Read the MySQL password from this file (one trailing newline is dropped), e.g. a systemd credential; the URL must then have none' -r -F
complete -c seckill -n "__fish_seckill_using_subcommand pending" -l redis-ca-cert -d 'CA certificate (PEM) to trust for rediss:// URLs instead of the system\'s roots' -r -F
complete -c seckill -n "__fish_seckill_using_subcommand pending" -l redis-client-cert -d 'Client certificate (PEM) for rediss:// with mutual TLS' -r -F
complete -c seckill -n "__fish_seckill_using_subcommand pending" -l redis-client-key -d 'The client certificate\'s private key (PEM)' -r -F
complete -c seckill -n "__fish_seckill_using_subcommand pending" -l mysql-ssl-mode -d 'MySQL TLS, as the mysql client\'s --ssl-mode: verify-ca checks the certificate\'s chain, verify-identity its host name too' -r -f -a "disabled\t''
preferred\t''
required\t''
verify-ca\t''
verify-identity\t''"
complete -c seckill -n "__fish_seckill_using_subcommand pending" -l mysql-ca-cert -d 'CA certificate (PEM) to check the MySQL server\'s certificate against (verify-ca, verify-identity) instead of the built-in roots' -r -F
complete -c seckill -n "__fish_seckill_using_subcommand pending" -l mysql-client-cert -d 'Client certificate (PEM) for MySQL with mutual TLS' -r -F
complete -c seckill -n "__fish_seckill_using_subcommand pending" -l mysql-client-key -d 'The client certificate\'s private key (PEM)' -r -F
complete -c seckill -n "__fish_seckill_using_subcommand pending" -l requeue -d 'Move the voucher\'s dead letters back into its order stream (after fixing their cause); with --entry only those'
complete -c seckill -n "__fish_seckill_using_subcommand pending" -s y -l yes -d 'Do not ask for confirmation (for cron and scripts)'
complete -c seckill -n "__fish_seckill_using_subcommand pending" -s v -l verbose -d 'More log output on stderr (-v debug, -vv trace); RUST_LOG overrides'
complete -c seckill -n "__fish_seckill_using_subcommand pending" -s q -l quiet -d 'Only errors on stderr'
complete -c seckill -n "__fish_seckill_using_subcommand pending" -s h -l help -d 'Print help (see more with \'--help\')'
complete -c seckill -n "__fish_seckill_using_subcommand pending" -s V -l version -d 'Print version'
complete -c seckill -n "__fish_seckill_using_subcommand pay" -l order -d 'Order id' -r
complete -c seckill -n "__fish_seckill_using_subcommand pay" -l format -d 'Output format' -r -f -a "table\t'A table for people'
json\t'JSON for scripts'"
complete -c seckill -n "__fish_seckill_using_subcommand pay" -l redis-url -d 'Redis URL (redis://[:password@]host:port/[db])' -r
complete -c seckill -n "__fish_seckill_using_subcommand pay" -l mysql-url -d 'MySQL URL (mysql://user:password@host:port/database) [default: mysql://seckill:***@127.0.0.1:13306/seckill]' -r
complete -c seckill -n "__fish_seckill_using_subcommand pay" -l prefix -d 'Key prefix of every Redis key' -r
complete -c seckill -n "__fish_seckill_using_subcommand pay" -l connect-timeout -d 'How long to wait for a server to accept a connection' -r
complete -c seckill -n "__fish_seckill_using_subcommand pay" -l redis-password-file -d 'Read the Redis password from this file (one trailing newline is dropped), e.g. a systemd credential; the URL must then have none' -r -F
complete -c seckill -n "__fish_seckill_using_subcommand pay" -l mysql-password-file -d 'Read the MySQL password from this file (one trailing newline is dropped), e.g. a systemd credential; the URL must then have none' -r -F
complete -c seckill -n "__fish_seckill_using_subcommand pay" -l redis-ca-cert -d 'CA certificate (PEM) to trust for rediss:// URLs instead of the system\'s roots' -r -F
complete -c seckill -n "__fish_seckill_using_subcommand pay" -l redis-client-cert -d 'Client certificate (PEM) for rediss:// with mutual TLS' -r -F
complete -c seckill -n "__fish_seckill_using_subcommand pay" -l redis-client-key -d 'The client certificate\'s private key (PEM)' -r -F
complete -c seckill -n "__fish_seckill_using_subcommand pay" -l mysql-ssl-mode -d 'MySQL TLS, as the mysql client\'s --ssl-mode: verify-ca checks the certificate\'s chain, verify-identity its host name too' -r -f -a "disabled\t''
preferred\t''
required\t''
verify-ca\t''
verify-identity\t''"
complete -c seckill -n "__fish_seckill_using_subcommand pay" -l mysql-ca-cert -d 'CA certificate (PEM) to check the MySQL server\'s certificate against (verify-ca, verify-identity) instead of the built-in roots' -r -F
complete -c seckill -n "__fish_seckill_using_subcommand pay" -l mysql-client-cert -d 'Client certificate (PEM) for MySQL with mutual TLS' -r -F
complete -c seckill -n "__fish_seckill_using_subcommand pay" -l mysql-client-key -d 'The client certificate\'s private key (PEM)' -r -F
complete -c seckill -n "__fish_seckill_using_subcommand pay" -s v -l verbose -d 'More log output on stderr (-v debug, -vv trace); RUST_LOG overrides'
complete -c seckill -n "__fish_seckill_using_subcommand pay" -s q -l quiet -d 'Only errors on stderr'
complete -c seckill -n "__fish_seckill_using_subcommand pay" -s h -l help -d 'Print help (see more with \'--help\')'
complete -c seckill -n "__fish_seckill_using_subcommand pay" -s V -l version -d 'Print version'
complete -c seckill -n "__fish_seckill_using_subcommand order; and not __fish_seen_subcommand_from show unhold help" -l redis-url -d 'Redis URL (redis://[:password@]host:port/[db])' -r
complete -c seckill -n "__fish_seckill_using_subcommand order; and not __fish_seen_subcommand_from show unhold help" -l mysql-url -d 'MySQL URL (mysql://user:password@host:port/database) [default: mysql://seckill:***@127.0.0.1:13306/seckill]' -r
complete -c seckill -n "__fish_seckill_using_subcommand order; and not __fish_seen_subcommand_from show unhold help" -l prefix -d 'Key prefix of every Redis key' -r
complete -c seckill -n "__fish_seckill_using_subcommand order; and not __fish_seen_subcommand_from show unhold help" -l connect-timeout -d 'How long to wait for a server to accept a connection' -r
complete -c seckill -n "__fish_seckill_using_subcommand order; and not __fish_seen_subcommand_from show unhold help" -l redis-password-file -d 'Read the Redis password from this file (one trailing newline is dropped), e.g. a systemd credential; the URL must then have none' -r -F
complete -c seckill -n "__fish_seckill_using_subcommand order; and not __fish_seen_subcommand_from show unhold help" -l mysql-password-file -d 'Read the MySQL password from this file (one trailing newline is dropped), e.g. a systemd credential; the URL must then have none' -r -F
complete -c seckill -n "__fish_seckill_using_subcommand order; and not __fish_seen_subcommand_from show unhold help" -l redis-ca-cert -d 'CA certificate (PEM) to trust for rediss:// URLs instead of the system\'s roots' -r -F
complete -c seckill -n "__fish_seckill_using_subcommand order; and not __fish_seen_subcommand_from show unhold help" -l redis-client-cert -d 'Client certificate (PEM) for rediss:// with mutual TLS' -r -F
complete -c seckill -n "__fish_seckill_using_subcommand order; and not __fish_seen_subcommand_from show unhold help" -l redis-client-key -d 'The client certificate\'s private key (PEM)' -r -F
complete -c seckill -n "__fish_seckill_using_subcommand order; and not __fish_seen_subcommand_from show unhold help" -l mysql-ssl-mode -d 'MySQL TLS, as the mysql client\'s --ssl-mode: verify-ca checks the certificate\'s chain, verify-identity its host name too' -r -f -a "disabled\t''
preferred\t''
required\t''
verify-ca\t''
verify-identity\t''"
complete -c seckill -n "__fish_seckill_using_subcommand order; and not __fish_seen_subcommand_from show unhold help" -l mysql-ca-cert -d 'CA certificate (PEM) to check the MySQL server\'s certificate against (verify-ca, verify-identity) instead of the built-in roots' -r -F
complete -c seckill -n "__fish_seckill_using_subcommand order; and not __fish_seen_subcommand_from show unhold help" -l mysql-client-cert -d 'Client certificate (PEM) for MySQL with mutual TLS' -r -F
complete -c seckill -n "__fish_seckill_using_subcommand order; and not __fish_seen_subcommand_from show unhold help" -l mysql-client-key -d 'The client certificate\'s private key (PEM)' -r -F
complete -c seckill -n "__fish_seckill_using_subcommand order; and not __fish_seen_subcommand_from show unhold help" -s v -l verbose -d 'More log output on stderr (-v debug, -vv trace); RUST_LOG overrides'
complete -c seckill -n "__fish_seckill_using_subcommand order; and not __fish_seen_subcommand_from show unhold help" -s q -l quiet -d 'Only errors on stderr'
complete -c seckill -n "__fish_seckill_using_subcommand order; and not __fish_seen_subcommand_from show unhold help" -s h -l help -d 'Print help'
complete -c seckill -n "__fish_seckill_using_subcommand order; and not __fish_seen_subcommand_from show unhold help" -s V -l version -d 'Print version'
complete -c seckill -n "__fish_seckill_using_subcommand order; and not __fish_seen_subcommand_from show unhold help" -f -a "show" -d 'One order: status, user, voucher, created, payment deadline, paid/cancelled time'
complete -c seckill -n "__fish_seckill_using_subcommand order; and not __fish_seen_subcommand_from show unhold help" -f -a "unhold" -d 'Let a held order\'s payment deadline run (the payment provider has it unpaid): reconcile schedules it again, and past it the order is cancelled and its unit given back'
complete -c seckill -n "__fish_seckill_using_subcommand order; and not __fish_seen_subcommand_from show unhold help" -f -a "help" -d 'Print this message or the help of the given subcommand(s)'
complete -c seckill -n "__fish_seckill_using_subcommand order; and __fish_seen_subcommand_from show" -l format -d 'Output format' -r -f -a "table\t'A table for people'
json\t'JSON for scripts'"
complete -c seckill -n "__fish_seckill_using_subcommand order; and __fish_seen_subcommand_from show" -l redis-url -d 'Redis URL (redis://[:password@]host:port/[db])' -r
complete -c seckill -n "__fish_seckill_using_subcommand order; and __fish_seen_subcommand_from show" -l mysql-url -d 'MySQL URL (mysql://user:password@host:port/database) [default: mysql://seckill:***@127.0.0.1:13306/seckill]' -r
complete -c seckill -n "__fish_seckill_using_subcommand order; and __fish_seen_subcommand_from show" -l prefix -d 'Key prefix of every Redis key' -r
complete -c seckill -n "__fish_seckill_using_subcommand order; and __fish_seen_subcommand_from show" -l connect-timeout -d 'How long to wait for a server to accept a connection' -r
complete -c seckill -n "__fish_seckill_using_subcommand order; and __fish_seen_subcommand_from show" -l redis-password-file -d 'Read the Redis password from this file (one trailing newline is dropped), e.g. a systemd credential; the URL must then have none' -r -F
complete -c seckill -n "__fish_seckill_using_subcommand order; and __fish_seen_subcommand_from show" -l mysql-password-file -d 'Read the MySQL password from this file (one trailing newline is dropped), e.g. a systemd credential; the URL must then have none' -r -F
complete -c seckill -n "__fish_seckill_using_subcommand order; and __fish_seen_subcommand_from show" -l redis-ca-cert -d 'CA certificate (PEM) to trust for rediss:// URLs instead of the system\'s roots' -r -F
complete -c seckill -n "__fish_seckill_using_subcommand order; and __fish_seen_subcommand_from show" -l redis-client-cert -d 'Client certificate (PEM) for rediss:// with mutual TLS' -r -F
complete -c seckill -n "__fish_seckill_using_subcommand order; and __fish_seen_subcommand_from show" -l redis-client-key -d 'The client certificate\'s private key (PEM)' -r -F
complete -c seckill -n "__fish_seckill_using_subcommand order; and __fish_seen_subcommand_from show" -l mysql-ssl-mode -d 'MySQL TLS, as the mysql client\'s --ssl-mode: verify-ca checks the certificate\'s chain, verify-identity its host name too' -r -f -a "disabled\t''
preferred\t''
required\t''
verify-ca\t''
verify-identity\t''"
complete -c seckill -n "__fish_seckill_using_subcommand order; and __fish_seen_subcommand_from show" -l mysql-ca-cert -d 'CA certificate (PEM) to check the MySQL server\'s certificate against (verify-ca, verify-identity) instead of the built-in roots' -r -F
complete -c seckill -n "__fish_seckill_using_subcommand order; and __fish_seen_subcommand_from show" -l mysql-client-cert -d 'Client certificate (PEM) for MySQL with mutual TLS' -r -F
complete -c seckill -n "__fish_seckill_using_subcommand order; and __fish_seen_subcommand_from show" -l mysql-client-key -d 'The client certificate\'s private key (PEM)' -r -F
complete -c seckill -n "__fish_seckill_using_subcommand order; and __fish_seen_subcommand_from show" -s v -l verbose -d 'More log output on stderr (-v debug, -vv trace); RUST_LOG overrides'
complete -c seckill -n "__fish_seckill_using_subcommand order; and __fish_seen_subcommand_from show" -s q -l quiet -d 'Only errors on stderr'
complete -c seckill -n "__fish_seckill_using_subcommand order; and __fish_seen_subcommand_from show" -s h -l help -d 'Print help (see more with \'--help\')'
complete -c seckill -n "__fish_seckill_using_subcommand order; and __fish_seen_subcommand_from show" -s V -l version -d 'Print version'
complete -c seckill -n "__fish_seckill_using_subcommand order; and __fish_seen_subcommand_from unhold" -l order -d 'Order id' -r
complete -c seckill -n "__fish_seckill_using_subcommand order; and __fish_seen_subcommand_from unhold" -l redis-url -d 'Redis URL (redis://[:password@]host:port/[db])' -r
complete -c seckill -n "__fish_seckill_using_subcommand order; and __fish_seen_subcommand_from unhold" -l mysql-url -d 'MySQL URL (mysql://user:password@host:port/database) [default: mysql://seckill:***@127.0.0.1:13306/seckill]' -r
complete -c seckill -n "__fish_seckill_using_subcommand order; and __fish_seen_subcommand_from unhold" -l prefix -d 'Key prefix of every Redis key' -r
complete -c seckill -n "__fish_seckill_using_subcommand order; and __fish_seen_subcommand_from unhold" -l connect-timeout -d 'How long to wait for a server to accept a connection' -r
complete -c seckill -n "__fish_seckill_using_subcommand order; and __fish_seen_subcommand_from unhold" -l redis-password-file -d 'Read the Redis password from this file (one trailing newline is dropped), e.g. a systemd credential; the URL must then have none' -r -F
complete -c seckill -n "__fish_seckill_using_subcommand order; and __fish_seen_subcommand_from unhold" -l mysql-password-file -d 'Read the MySQL password from this file (one trailing newline is dropped), e.g. a systemd credential; the URL must then have none' -r -F
complete -c seckill -n "__fish_seckill_using_subcommand order; and __fish_seen_subcommand_from unhold" -l redis-ca-cert -d 'CA certificate (PEM) to trust for rediss:// URLs instead of the system\'s roots' -r -F
complete -c seckill -n "__fish_seckill_using_subcommand order; and __fish_seen_subcommand_from unhold" -l redis-client-cert -d 'Client certificate (PEM) for rediss:// with mutual TLS' -r -F
complete -c seckill -n "__fish_seckill_using_subcommand order; and __fish_seen_subcommand_from unhold" -l redis-client-key -d 'The client certificate\'s private key (PEM)' -r -F
complete -c seckill -n "__fish_seckill_using_subcommand order; and __fish_seen_subcommand_from unhold" -l mysql-ssl-mode -d 'MySQL TLS, as the mysql client\'s --ssl-mode: verify-ca checks the certificate\'s chain, verify-identity its host name too' -r -f -a "disabled\t''
preferred\t''
required\t''
verify-ca\t''
verify-identity\t''"
complete -c seckill -n "__fish_seckill_using_subcommand order; and __fish_seen_subcommand_from unhold" -l mysql-ca-cert -d 'CA certificate (PEM) to check the MySQL server\'s certificate against (verify-ca, verify-identity) instead of the built-in roots' -r -F
complete -c seckill -n "__fish_seckill_using_subcommand order; and __fish_seen_subcommand_from unhold" -l mysql-client-cert -d 'Client certificate (PEM) for MySQL with mutual TLS' -r -F
complete -c seckill -n "__fish_seckill_using_subcommand order; and __fish_seen_subcommand_from unhold" -l mysql-client-key -d 'The client certificate\'s private key (PEM)' -r -F
complete -c seckill -n "__fish_seckill_using_subcommand order; and __fish_seen_subcommand_from unhold" -s v -l verbose -d 'More log output on stderr (-v debug, -vv trace); RUST_LOG overrides'
complete -c seckill -n "__fish_seckill_using_subcommand order; and __fish_seen_subcommand_from unhold" -s q -l quiet -d 'Only errors on stderr'
complete -c seckill -n "__fish_seckill_using_subcommand order; and __fish_seen_subcommand_from unhold" -s h -l help -d 'Print help'
complete -c seckill -n "__fish_seckill_using_subcommand order; and __fish_seen_subcommand_from unhold" -s V -l version -d 'Print version'
complete -c seckill -n "__fish_seckill_using_subcommand order; and __fish_seen_subcommand_from help" -f -a "show" -d 'One order: status, user, voucher, created, payment deadline, paid/cancelled time'
complete -c seckill -n "__fish_seckill_using_subcommand order; and __fish_seen_subcommand_from help" -f -a "unhold" -d 'Let a held order\'s payment deadline run (the payment provider has it unpaid): reconcile schedules it again, and past it the order is cancelled and its unit given back'
complete -c seckill -n "__fish_seckill_using_subcommand order; and __fish_seen_subcommand_from help" -f -a "help" -d 'Print this message or the help of the given subcommand(s)'
complete -c seckill -n "__fish_seckill_using_subcommand waitlist" -l voucher -d 'Voucher id' -r
complete -c seckill -n "__fish_seckill_using_subcommand waitlist" -l limit -d 'How many users from the head of the line to show' -r
complete -c seckill -n "__fish_seckill_using_subcommand waitlist" -l format -d 'Output format' -r -f -a "table\t'A table for people'
json\t'JSON for scripts'"
complete -c seckill -n "__fish_seckill_using_subcommand waitlist" -l redis-url -d 'Redis URL (redis://[:password@]host:port/[db])' -r
complete -c seckill -n "__fish_seckill_using_subcommand waitlist" -l mysql-url -d 'MySQL URL (mysql://user:password@host:port/database) [default: mysql://seckill:***@127.0.0.1:13306/seckill]' -r
complete -c seckill -n "__fish_seckill_using_subcommand waitlist" -l prefix -d 'Key prefix of every Redis key' -r
complete -c seckill -n "__fish_seckill_using_subcommand waitlist" -l connect-timeout -d 'How long to wait for a server to accept a connection' -r
complete -c seckill -n "__fish_seckill_using_subcommand waitlist" -l redis-password-file -d 'Read the Redis password from this file (one trailing newline is dropped), e.g. a systemd credential; the URL must then have none' -r -F
complete -c seckill -n "__fish_seckill_using_subcommand waitlist" -l mysql-password-file -d 'Read the MySQL password from this file (one trailing newline is dropped), e.g. a systemd credential; the URL must then have none' -r -F
complete -c seckill -n "__fish_seckill_using_subcommand waitlist" -l redis-ca-cert -d 'CA certificate (PEM) to trust for rediss:// URLs instead of the system\'s roots' -r -F
complete -c seckill -n "__fish_seckill_using_subcommand waitlist" -l redis-client-cert -d 'Client certificate (PEM) for rediss:// with mutual TLS' -r -F
complete -c seckill -n "__fish_seckill_using_subcommand waitlist" -l redis-client-key -d 'The client certificate\'s private key (PEM)' -r -F
complete -c seckill -n "__fish_seckill_using_subcommand waitlist" -l mysql-ssl-mode -d 'MySQL TLS, as the mysql client\'s --ssl-mode: verify-ca checks the certificate\'s chain, verify-identity its host name too' -r -f -a "disabled\t''
preferred\t''
required\t''
verify-ca\t''
verify-identity\t''"
complete -c seckill -n "__fish_seckill_using_subcommand waitlist" -l mysql-ca-cert -d 'CA certificate (PEM) to check the MySQL server\'s certificate against (verify-ca, verify-identity) instead of the built-in roots' -r -F
complete -c seckill -n "__fish_seckill_using_subcommand waitlist" -l mysql-client-cert -d 'Client certificate (PEM) for MySQL with mutual TLS' -r -F
complete -c seckill -n "__fish_seckill_using_subcommand waitlist" -l mysql-client-key -d 'The client certificate\'s private key (PEM)' -r -F
complete -c seckill -n "__fish_seckill_using_subcommand waitlist" -s v -l verbose -d 'More log output on stderr (-v debug, -vv trace); RUST_LOG overrides'
complete -c seckill -n "__fish_seckill_using_subcommand waitlist" -s q -l quiet -d 'Only errors on stderr'
complete -c seckill -n "__fish_seckill_using_subcommand waitlist" -s h -l help -d 'Print help (see more with \'--help\')'
complete -c seckill -n "__fish_seckill_using_subcommand waitlist" -s V -l version -d 'Print version'
complete -c seckill -n "__fish_seckill_using_subcommand reconcile" -l voucher -d 'Only these vouchers (repeatable) [default: every voucher registered at the gate or holding orders in MySQL]' -r
complete -c seckill -n "__fish_seckill_using_subcommand reconcile" -l drop-lost-commits -d 'Drop the buyers whose orders MySQL may have lost with their stream entries (drift orders_lost_unrestorable), their units back on sale: give the amount the report names (one --voucher only)' -r
complete -c seckill -n "__fish_seckill_using_subcommand reconcile" -l attempts -d 'How often to re-read a voucher that keeps moving before calling it busy' -r
complete -c seckill -n "__fish_seckill_using_subcommand reconcile" -l settle -d 'Cancellations and new orders younger than this are still being handled by a worker, not drift (keep it above the worker\'s --deadline-lease)' -r
complete -c seckill -n "__fish_seckill_using_subcommand reconcile" -l node-id -d 'Snowflake node id (0..=1023), leased from Redis: refused while another live process holds it [default: a free one, leased]' -r
complete -c seckill -n "__fish_seckill_using_subcommand reconcile" -l format -d 'Output format' -r -f -a "table\t'A table for people'
json\t'JSON for scripts'"
complete -c seckill -n "__fish_seckill_using_subcommand reconcile" -l redis-url -d 'Redis URL (redis://[:password@]host:port/[db])' -r
complete -c seckill -n "__fish_seckill_using_subcommand reconcile" -l mysql-url -d 'MySQL URL (mysql://user:password@host:port/database) [default: mysql://seckill:***@127.0.0.1:13306/seckill]' -r
complete -c seckill -n "__fish_seckill_using_subcommand reconcile" -l prefix -d 'Key prefix of every Redis key' -r
complete -c seckill -n "__fish_seckill_using_subcommand reconcile" -l connect-timeout -d 'How long to wait for a server to accept a connection' -r
complete -c seckill -n "__fish_seckill_using_subcommand reconcile" -l redis-password-file -d 'Read the Redis password from this file (one trailing newline is dropped), e.g. a systemd credential; the URL must then have none' -r -F
complete -c seckill -n "__fish_seckill_using_subcommand reconcile" -l mysql-password-file -d 'Read the MySQL password from this file (one trailing newline is dropped), e.g. a systemd credential; the URL must then have none' -r -F
complete -c seckill -n "__fish_seckill_using_subcommand reconcile" -l redis-ca-cert -d 'CA certificate (PEM) to trust for rediss:// URLs instead of the system\'s roots' -r -F
complete -c seckill -n "__fish_seckill_using_subcommand reconcile" -l redis-client-cert -d 'Client certificate (PEM) for rediss:// with mutual TLS' -r -F
complete -c seckill -n "__fish_seckill_using_subcommand reconcile" -l redis-client-key -d 'The client certificate\'s private key (PEM)' -r -F
complete -c seckill -n "__fish_seckill_using_subcommand reconcile" -l mysql-ssl-mode -d 'MySQL TLS, as the mysql client\'s --ssl-mode: verify-ca checks the certificate\'s chain, verify-identity its host name too' -r -f -a "disabled\t''
preferred\t''
required\t''
verify-ca\t''
verify-identity\t''"
complete -c seckill -n "__fish_seckill_using_subcommand reconcile" -l mysql-ca-cert -d 'CA certificate (PEM) to check the MySQL server\'s certificate against (verify-ca, verify-identity) instead of the built-in roots' -r -F
complete -c seckill -n "__fish_seckill_using_subcommand reconcile" -l mysql-client-cert -d 'Client certificate (PEM) for MySQL with mutual TLS' -r -F
complete -c seckill -n "__fish_seckill_using_subcommand reconcile" -l mysql-client-key -d 'The client certificate\'s private key (PEM)' -r -F
complete -c seckill -n "__fish_seckill_using_subcommand reconcile" -l dry-run -d 'Report what would be repaired; change nothing'
complete -c seckill -n "__fish_seckill_using_subcommand reconcile" -l fix-mysql -d 'Also repair MySQL when its stock + active orders != total'
complete -c seckill -n "__fish_seckill_using_subcommand reconcile" -l deep -d 'Read every voucher in full (every order, buyer, release and deadline) and count MySQL\'s orders again, instead of comparing counts and digests first; finds a counter or digest that drifted from its rows'
complete -c seckill -n "__fish_seckill_using_subcommand reconcile" -s y -l yes -d 'Do not ask for confirmation (for cron and scripts)'
complete -c seckill -n "__fish_seckill_using_subcommand reconcile" -s v -l verbose -d 'More log output on stderr (-v debug, -vv trace); RUST_LOG overrides'
complete -c seckill -n "__fish_seckill_using_subcommand reconcile" -s q -l quiet -d 'Only errors on stderr'
complete -c seckill -n "__fish_seckill_using_subcommand reconcile" -s h -l help -d 'Print help (see more with \'--help\')'
complete -c seckill -n "__fish_seckill_using_subcommand reconcile" -s V -l version -d 'Print version'
complete -c seckill -n "__fish_seckill_using_subcommand doctor" -l role -d 'Also try the rights this role\'s users need (contrib/redis-acl.conf, contrib/mysql-grants.sql), as the users of the URLs, writing nothing' -r -f -a "worker\t''
serve\t''
operator\t''
schema\t''"
complete -c seckill -n "__fish_seckill_using_subcommand doctor" -l format -d 'Output format' -r -f -a "table\t'A table for people'
json\t'JSON for scripts'"
complete -c seckill -n "__fish_seckill_using_subcommand doctor" -l redis-url -d 'Redis URL (redis://[:password@]host:port/[db])' -r
complete -c seckill -n "__fish_seckill_using_subcommand doctor" -l mysql-url -d 'MySQL URL (mysql://user:password@host:port/database) [default: mysql://seckill:***@127.0.0.1:13306/seckill]' -r
complete -c seckill -n "__fish_seckill_using_subcommand doctor" -l prefix -d 'Key prefix of every Redis key' -r
complete -c seckill -n "__fish_seckill_using_subcommand doctor" -l connect-timeout -d 'How long to wait for a server to accept a connection' -r
complete -c seckill -n "__fish_seckill_using_subcommand doctor" -l redis-password-file -d 'Read the Redis password from this file (one trailing newline is dropped), e.g. a systemd credential; the URL must then have none' -r -F
complete -c seckill -n "__fish_seckill_using_subcommand doctor" -l mysql-password-file -d 'Read the MySQL password from this file (one trailing newline is dropped), e.g. a systemd credential; the URL must then have none' -r -F
complete -c seckill -n "__fish_seckill_using_subcommand doctor" -l redis-ca-cert -d 'CA certificate (PEM) to trust for rediss:// URLs instead of the system\'s roots' -r -F
complete -c seckill -n "__fish_seckill_using_subcommand doctor" -l redis-client-cert -d 'Client certificate (PEM) for rediss:// with mutual TLS' -r -F
complete -c seckill -n "__fish_seckill_using_subcommand doctor" -l redis-client-key -d 'The client certificate\'s private key (PEM)' -r -F
complete -c seckill -n "__fish_seckill_using_subcommand doctor" -l mysql-ssl-mode -d 'MySQL TLS, as the mysql client\'s --ssl-mode: verify-ca checks the certificate\'s chain, verify-identity its host name too' -r -f -a "disabled\t''
preferred\t''
required\t''
verify-ca\t''
verify-identity\t''"
complete -c seckill -n "__fish_seckill_using_subcommand doctor" -l mysql-ca-cert -d 'CA certificate (PEM) to check the MySQL server\'s certificate against (verify-ca, verify-identity) instead of the built-in roots' -r -F
complete -c seckill -n "__fish_seckill_using_subcommand doctor" -l mysql-client-cert -d 'Client certificate (PEM) for MySQL with mutual TLS' -r -F
complete -c seckill -n "__fish_seckill_using_subcommand doctor" -l mysql-client-key -d 'The client certificate\'s private key (PEM)' -r -F
complete -c seckill -n "__fish_seckill_using_subcommand doctor" -s v -l verbose -d 'More log output on stderr (-v debug, -vv trace); RUST_LOG overrides'
complete -c seckill -n "__fish_seckill_using_subcommand doctor" -s q -l quiet -d 'Only errors on stderr'
complete -c seckill -n "__fish_seckill_using_subcommand doctor" -s h -l help -d 'Print help (see more with \'--help\')'
complete -c seckill -n "__fish_seckill_using_subcommand doctor" -s V -l version -d 'Print version'
complete -c seckill -n "__fish_seckill_using_subcommand generate" -l out-dir -d 'Directory that receives completions/ and man/' -r -F
complete -c seckill -n "__fish_seckill_using_subcommand generate" -l redis-url -d 'Redis URL (redis://[:password@]host:port/[db])' -r
complete -c seckill -n "__fish_seckill_using_subcommand generate" -l mysql-url -d 'MySQL URL (mysql://user:password@host:port/database) [default: mysql://seckill:***@127.0.0.1:13306/seckill]' -r
complete -c seckill -n "__fish_seckill_using_subcommand generate" -l prefix -d 'Key prefix of every Redis key' -r
complete -c seckill -n "__fish_seckill_using_subcommand generate" -l connect-timeout -d 'How long to wait for a server to accept a connection' -r
complete -c seckill -n "__fish_seckill_using_subcommand generate" -l redis-password-file -d 'Read the Redis password from this file (one trailing newline is dropped), e.g. a systemd credential; the URL must then have none' -r -F
complete -c seckill -n "__fish_seckill_using_subcommand generate" -l mysql-password-file -d 'Read the MySQL password from this file (one trailing newline is dropped), e.g. a systemd credential; the URL must then have none' -r -F
complete -c seckill -n "__fish_seckill_using_subcommand generate" -l redis-ca-cert -d 'CA certificate (PEM) to trust for rediss:// URLs instead of the system\'s roots' -r -F
complete -c seckill -n "__fish_seckill_using_subcommand generate" -l redis-client-cert -d 'Client certificate (PEM) for rediss:// with mutual TLS' -r -F
complete -c seckill -n "__fish_seckill_using_subcommand generate" -l redis-client-key -d 'The client certificate\'s private key (PEM)' -r -F
complete -c seckill -n "__fish_seckill_using_subcommand generate" -l mysql-ssl-mode -d 'MySQL TLS, as the mysql client\'s --ssl-mode: verify-ca checks the certificate\'s chain, verify-identity its host name too' -r -f -a "disabled\t''
preferred\t''
required\t''
verify-ca\t''
verify-identity\t''"
complete -c seckill -n "__fish_seckill_using_subcommand generate" -l mysql-ca-cert -d 'CA certificate (PEM) to check the MySQL server\'s certificate against (verify-ca, verify-identity) instead of the built-in roots' -r -F
complete -c seckill -n "__fish_seckill_using_subcommand generate" -l mysql-client-cert -d 'Client certificate (PEM) for MySQL with mutual TLS' -r -F
complete -c seckill -n "__fish_seckill_using_subcommand generate" -l mysql-client-key -d 'The client certificate\'s private key (PEM)' -r -F
complete -c seckill -n "__fish_seckill_using_subcommand generate" -s v -l verbose -d 'More log output on stderr (-v debug, -vv trace); RUST_LOG overrides'
complete -c seckill -n "__fish_seckill_using_subcommand generate" -s q -l quiet -d 'Only errors on stderr'
complete -c seckill -n "__fish_seckill_using_subcommand generate" -s h -l help -d 'Print help'
complete -c seckill -n "__fish_seckill_using_subcommand generate" -s V -l version -d 'Print version'
complete -c seckill -n "__fish_seckill_using_subcommand help; and not __fish_seen_subcommand_from init status voucher preload buy bench token worker serve pending pay order waitlist reconcile doctor generate help" -f -a "init" -d 'Create or upgrade the MySQL schema and check both servers\' versions'
complete -c seckill -n "__fish_seckill_using_subcommand help; and not __fish_seen_subcommand_from init status voucher preload buy bench token worker serve pending pay order waitlist reconcile doctor generate help" -f -a "status" -d 'One row per voucher: both stores side by side, in flight, dead letters, deadlines'
complete -c seckill -n "__fish_seckill_using_subcommand help; and not __fish_seen_subcommand_from init status voucher preload buy bench token worker serve pending pay order waitlist reconcile doctor generate help" -f -a "voucher" -d 'Add and list vouchers (MySQL, the source of truth)'
complete -c seckill -n "__fish_seckill_using_subcommand help; and not __fish_seen_subcommand_from init status voucher preload buy bench token worker serve pending pay order waitlist reconcile doctor generate help" -f -a "preload" -d 'Load vouchers from MySQL into the Redis gate and register them for workers'
complete -c seckill -n "__fish_seckill_using_subcommand help; and not __fish_seen_subcommand_from init status voucher preload buy bench token worker serve pending pay order waitlist reconcile doctor generate help" -f -a "buy" -d 'One admission attempt through lua/seckill.lua (exit code tells the outcome)'
complete -c seckill -n "__fish_seckill_using_subcommand help; and not __fish_seen_subcommand_from init status voucher preload buy bench token worker serve pending pay order waitlist reconcile doctor generate help" -f -a "bench" -d 'Load-test the admission script and report attempts/s and latency'
complete -c seckill -n "__fish_seckill_using_subcommand help; and not __fish_seen_subcommand_from init status voucher preload buy bench token worker serve pending pay order waitlist reconcile doctor generate help" -f -a "token" -d 'Admission tokens for vouchers that require them'
complete -c seckill -n "__fish_seckill_using_subcommand help; and not __fish_seen_subcommand_from init status voucher preload buy bench token worker serve pending pay order waitlist reconcile doctor generate help" -f -a "worker" -d 'Persist admitted orders to MySQL, cancel unpaid ones at their deadline (layers 2-5)'
complete -c seckill -n "__fish_seckill_using_subcommand help; and not __fish_seen_subcommand_from init status voucher preload buy bench token worker serve pending pay order waitlist reconcile doctor generate help" -f -a "serve" -d 'The HTTP front door: purchases, tokens, sale state, orders and payment over JSON'
complete -c seckill -n "__fish_seckill_using_subcommand help; and not __fish_seen_subcommand_from init status voucher preload buy bench token worker serve pending pay order waitlist reconcile doctor generate help" -f -a "pending" -d 'Show stream backlog, pending entries and dead letters; requeue dead letters'
complete -c seckill -n "__fish_seckill_using_subcommand help; and not __fish_seen_subcommand_from init status voucher preload buy bench token worker serve pending pay order waitlist reconcile doctor generate help" -f -a "pay" -d 'Mark a pending order paid (before its payment deadline)'
complete -c seckill -n "__fish_seckill_using_subcommand help; and not __fish_seen_subcommand_from init status voucher preload buy bench token worker serve pending pay order waitlist reconcile doctor generate help" -f -a "order" -d 'Look up orders'
complete -c seckill -n "__fish_seckill_using_subcommand help; and not __fish_seen_subcommand_from init status voucher preload buy bench token worker serve pending pay order waitlist reconcile doctor generate help" -f -a "waitlist" -d 'Show a voucher\'s waitlist and how many released units it received'
complete -c seckill -n "__fish_seckill_using_subcommand help; and not __fish_seen_subcommand_from init status voucher preload buy bench token worker serve pending pay order waitlist reconcile doctor generate help" -f -a "reconcile" -d 'Compare Redis with MySQL per voucher, classify drift, repair it safely'
complete -c seckill -n "__fish_seckill_using_subcommand help; and not __fish_seen_subcommand_from init status voucher preload buy bench token worker serve pending pay order waitlist reconcile doctor generate help" -f -a "doctor" -d 'Check that the servers are set up so the guarantees hold (exit 5: warnings, 6: failures)'
complete -c seckill -n "__fish_seckill_using_subcommand help; and not __fish_seen_subcommand_from init status voucher preload buy bench token worker serve pending pay order waitlist reconcile doctor generate help" -f -a "generate" -d 'Write shell completions and man pages (for packagers)'
complete -c seckill -n "__fish_seckill_using_subcommand help; and not __fish_seen_subcommand_from init status voucher preload buy bench token worker serve pending pay order waitlist reconcile doctor generate help" -f -a "help" -d 'Print this message or the help of the given subcommand(s)'
complete -c seckill -n "__fish_seckill_using_subcommand help; and __fish_seen_subcommand_from voucher" -f -a "add" -d 'Add a voucher to MySQL (then `seckill preload` opens it at the gate)'
complete -c seckill -n "__fish_seckill_using_subcommand help; and __fish_seen_subcommand_from voucher" -f -a "update" -d 'Change a voucher\'s admission policy, in MySQL and at the gate at once'
complete -c seckill -n "__fish_seckill_using_subcommand help; and __fish_seen_subcommand_from voucher" -f -a "list" -d 'List vouchers: MySQL stock and orders beside the Redis gate\'s state'
complete -c seckill -n "__fish_seckill_using_subcommand help; and __fish_seen_subcommand_from token" -f -a "issue" -d 'Issue a user\'s admission token for a voucher that requires one'
complete -c seckill -n "__fish_seckill_using_subcommand help; and __fish_seen_subcommand_from order" -f -a "show" -d 'One order: status, user, voucher, created, payment deadline, paid/cancelled time'
complete -c seckill -n "__fish_seckill_using_subcommand help; and __fish_seen_subcommand_from order" -f -a "unhold" -d 'Let a held order\'s payment deadline run (the payment provider has it unpaid): reconcile schedules it again, and past it the order is cancelled and its unit given back'
