_seckill() {
    local i cur prev opts cmd
    COMPREPLY=()
    if [[ "${BASH_VERSINFO[0]}" -ge 4 ]]; then
        cur="$2"
    else
        cur="${COMP_WORDS[COMP_CWORD]}"
    fi
    prev="$3"
    cmd=""
    opts=""

    for i in "${COMP_WORDS[@]:0:COMP_CWORD}"
    do
        case "${cmd},${i}" in
            ",$1")
                cmd="seckill"
                ;;
            seckill,bench)
                cmd="seckill__subcmd__bench"
                ;;
            seckill,buy)
                cmd="seckill__subcmd__buy"
                ;;
            seckill,doctor)
                cmd="seckill__subcmd__doctor"
                ;;
            seckill,generate)
                cmd="seckill__subcmd__generate"
                ;;
            seckill,help)
                cmd="seckill__subcmd__help"
                ;;
            seckill,init)
                cmd="seckill__subcmd__init"
                ;;
            seckill,order)
                cmd="seckill__subcmd__order"
                ;;
            seckill,pay)
                cmd="seckill__subcmd__pay"
                ;;
            seckill,pending)
                cmd="seckill__subcmd__pending"
                ;;
            seckill,preload)
                cmd="seckill__subcmd__preload"
                ;;
            seckill,reconcile)
                cmd="seckill__subcmd__reconcile"
                ;;
            seckill,serve)
                cmd="seckill__subcmd__serve"
                ;;
            seckill,status)
                cmd="seckill__subcmd__status"
                ;;
            seckill,token)
                cmd="seckill__subcmd__token"
                ;;
            seckill,voucher)
                cmd="seckill__subcmd__voucher"
                ;;
            seckill,waitlist)
                cmd="seckill__subcmd__waitlist"
                ;;
            seckill,worker)
                cmd="seckill__subcmd__worker"
                ;;
            seckill__subcmd__help,bench)
                cmd="seckill__subcmd__help__subcmd__bench"
                ;;
            seckill__subcmd__help,buy)
                cmd="seckill__subcmd__help__subcmd__buy"
                ;;
            seckill__subcmd__help,doctor)
                cmd="seckill__subcmd__help__subcmd__doctor"
                ;;
            seckill__subcmd__help,generate)
                cmd="seckill__subcmd__help__subcmd__generate"
                ;;
            seckill__subcmd__help,help)
                cmd="seckill__subcmd__help__subcmd__help"
                ;;
            seckill__subcmd__help,init)
                cmd="seckill__subcmd__help__subcmd__init"
                ;;
            seckill__subcmd__help,order)
                cmd="seckill__subcmd__help__subcmd__order"
                ;;
            seckill__subcmd__help,pay)
                cmd="seckill__subcmd__help__subcmd__pay"
                ;;
            seckill__subcmd__help,pending)
                cmd="seckill__subcmd__help__subcmd__pending"
                ;;
            seckill__subcmd__help,preload)
                cmd="seckill__subcmd__help__subcmd__preload"
                ;;
            seckill__subcmd__help,reconcile)
                cmd="seckill__subcmd__help__subcmd__reconcile"
                ;;
            seckill__subcmd__help,serve)
                cmd="seckill__subcmd__help__subcmd__serve"
                ;;
            seckill__subcmd__help,status)
                cmd="seckill__subcmd__help__subcmd__status"
                ;;
            seckill__subcmd__help,token)
                cmd="seckill__subcmd__help__subcmd__token"
                ;;
            seckill__subcmd__help,voucher)
                cmd="seckill__subcmd__help__subcmd__voucher"
                ;;
            seckill__subcmd__help,waitlist)
                cmd="seckill__subcmd__help__subcmd__waitlist"
                ;;
            seckill__subcmd__help,worker)
                cmd="seckill__subcmd__help__subcmd__worker"
                ;;
            seckill__subcmd__help__subcmd__order,show)
                cmd="seckill__subcmd__help__subcmd__order__subcmd__show"
                ;;
            seckill__subcmd__help__subcmd__order,unhold)
                cmd="seckill__subcmd__help__subcmd__order__subcmd__unhold"
                ;;
            seckill__subcmd__help__subcmd__token,issue)
                cmd="seckill__subcmd__help__subcmd__token__subcmd__issue"
                ;;
            seckill__subcmd__help__subcmd__voucher,add)
                cmd="seckill__subcmd__help__subcmd__voucher__subcmd__add"
                ;;
            seckill__subcmd__help__subcmd__voucher,list)
                cmd="seckill__subcmd__help__subcmd__voucher__subcmd__list"
                ;;
            seckill__subcmd__help__subcmd__voucher,update)
                cmd="seckill__subcmd__help__subcmd__voucher__subcmd__update"
                ;;
            seckill__subcmd__order,help)
                cmd="seckill__subcmd__order__subcmd__help"
                ;;
            seckill__subcmd__order,show)
                cmd="seckill__subcmd__order__subcmd__show"
                ;;
            seckill__subcmd__order,unhold)
                cmd="seckill__subcmd__order__subcmd__unhold"
                ;;
            seckill__subcmd__order__subcmd__help,help)
                cmd="seckill__subcmd__order__subcmd__help__subcmd__help"
                ;;
            seckill__subcmd__order__subcmd__help,show)
                cmd="seckill__subcmd__order__subcmd__help__subcmd__show"
                ;;
            seckill__subcmd__order__subcmd__help,unhold)
                cmd="seckill__subcmd__order__subcmd__help__subcmd__unhold"
                ;;
            seckill__subcmd__token,help)
                cmd="seckill__subcmd__token__subcmd__help"
                ;;
            seckill__subcmd__token,issue)
                cmd="seckill__subcmd__token__subcmd__issue"
                ;;
            seckill__subcmd__token__subcmd__help,help)
                cmd="seckill__subcmd__token__subcmd__help__subcmd__help"
                ;;
            seckill__subcmd__token__subcmd__help,issue)
                cmd="seckill__subcmd__token__subcmd__help__subcmd__issue"
                ;;
            seckill__subcmd__voucher,add)
                cmd="seckill__subcmd__voucher__subcmd__add"
                ;;
            seckill__subcmd__voucher,help)
                cmd="seckill__subcmd__voucher__subcmd__help"
                ;;
            seckill__subcmd__voucher,list)
                cmd="seckill__subcmd__voucher__subcmd__list"
                ;;
            seckill__subcmd__voucher,update)
                cmd="seckill__subcmd__voucher__subcmd__update"
                ;;
            seckill__subcmd__voucher__subcmd__help,add)
                cmd="seckill__subcmd__voucher__subcmd__help__subcmd__add"
                ;;
            seckill__subcmd__voucher__subcmd__help,help)
                cmd="seckill__subcmd__voucher__subcmd__help__subcmd__help"
                ;;
            seckill__subcmd__voucher__subcmd__help,list)
                cmd="seckill__subcmd__voucher__subcmd__help__subcmd__list"
                ;;
            seckill__subcmd__voucher__subcmd__help,update)
                cmd="seckill__subcmd__voucher__subcmd__help__subcmd__update"
                ;;
            *)
                ;;
        esac
    done

    case "${cmd}" in
        seckill)
            opts="-v -q -h -V --redis-url --mysql-url --prefix --connect-timeout --redis-password-file --mysql-password-file --redis-ca-cert --redis-client-cert --redis-client-key --mysql-ssl-mode --mysql-ca-cert --mysql-client-cert --mysql-client-key --verbose --quiet --help --version init status voucher preload buy bench token worker serve pending pay order waitlist reconcile doctor generate help"
            if [[ ${cur} == -* || ${COMP_CWORD} -eq 1 ]] ; then
                COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
                return 0
            fi
            case "${prev}" in
                --redis-url)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --mysql-url)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --prefix)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --connect-timeout)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --redis-password-file)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --mysql-password-file)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --redis-ca-cert)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --redis-client-cert)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --redis-client-key)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --mysql-ssl-mode)
                    COMPREPLY=($(compgen -W "disabled preferred required verify-ca verify-identity" -- "${cur}"))
                    return 0
                    ;;
                --mysql-ca-cert)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --mysql-client-cert)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --mysql-client-key)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                *)
                    COMPREPLY=()
                    ;;
            esac
            COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
            return 0
            ;;
        seckill__subcmd__bench)
            opts="-v -q -h -V --voucher --users --user-offset --attempts --concurrency --connections --tokens --quantity --wait-replicas --wait-timeout --node-id --format --redis-url --mysql-url --prefix --connect-timeout --redis-password-file --mysql-password-file --redis-ca-cert --redis-client-cert --redis-client-key --mysql-ssl-mode --mysql-ca-cert --mysql-client-cert --mysql-client-key --verbose --quiet --help --version"
            if [[ ${cur} == -* || ${COMP_CWORD} -eq 2 ]] ; then
                COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
                return 0
            fi
            case "${prev}" in
                --voucher)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --users)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --user-offset)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --attempts)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --concurrency)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --connections)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --quantity)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --wait-replicas)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --wait-timeout)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --node-id)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --format)
                    COMPREPLY=($(compgen -W "table json" -- "${cur}"))
                    return 0
                    ;;
                --redis-url)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --mysql-url)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --prefix)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --connect-timeout)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --redis-password-file)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --mysql-password-file)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --redis-ca-cert)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --redis-client-cert)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --redis-client-key)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --mysql-ssl-mode)
                    COMPREPLY=($(compgen -W "disabled preferred required verify-ca verify-identity" -- "${cur}"))
                    return 0
                    ;;
                --mysql-ca-cert)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --mysql-client-cert)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --mysql-client-key)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                *)
                    COMPREPLY=()
                    ;;
            esac
            COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
            return 0
            ;;
        seckill__subcmd__buy)
            opts="-v -q -h -V --voucher --user --token --quantity --idempotency-key --idempotency-ttl --client-reference --wait-replicas --wait-timeout --node-id --format --redis-url --mysql-url --prefix --connect-timeout --redis-password-file --mysql-password-file --redis-ca-cert --redis-client-cert --redis-client-key --mysql-ssl-mode --mysql-ca-cert --mysql-client-cert --mysql-client-key --verbose --quiet --help --version"
            if [[ ${cur} == -* || ${COMP_CWORD} -eq 2 ]] ; then
                COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
                return 0
            fi
            case "${prev}" in
                --voucher)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --user)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --token)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --quantity)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --idempotency-key)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --idempotency-ttl)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --client-reference)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --wait-replicas)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --wait-timeout)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --node-id)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --format)
                    COMPREPLY=($(compgen -W "table json" -- "${cur}"))
                    return 0
                    ;;
                --redis-url)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --mysql-url)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --prefix)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --connect-timeout)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --redis-password-file)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --mysql-password-file)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --redis-ca-cert)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --redis-client-cert)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --redis-client-key)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --mysql-ssl-mode)
                    COMPREPLY=($(compgen -W "disabled preferred required verify-ca verify-identity" -- "${cur}"))
                    return 0
                    ;;
                --mysql-ca-cert)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --mysql-client-cert)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --mysql-client-key)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                *)
                    COMPREPLY=()
                    ;;
            esac
            COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
            return 0
            ;;
        seckill__subcmd__doctor)
            opts="-v -q -h -V --role --format --redis-url --mysql-url --prefix --connect-timeout --redis-password-file --mysql-password-file --redis-ca-cert --redis-client-cert --redis-client-key --mysql-ssl-mode --mysql-ca-cert --mysql-client-cert --mysql-client-key --verbose --quiet --help --version"
            if [[ ${cur} == -* || ${COMP_CWORD} -eq 2 ]] ; then
                COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
                return 0
            fi
            case "${prev}" in
                --role)
                    COMPREPLY=($(compgen -W "worker serve operator schema" -- "${cur}"))
                    return 0
                    ;;
                --format)
                    COMPREPLY=($(compgen -W "table json" -- "${cur}"))
                    return 0
                    ;;
                --redis-url)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --mysql-url)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --prefix)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --connect-timeout)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --redis-password-file)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --mysql-password-file)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --redis-ca-cert)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --redis-client-cert)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --redis-client-key)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --mysql-ssl-mode)
                    COMPREPLY=($(compgen -W "disabled preferred required verify-ca verify-identity" -- "${cur}"))
                    return 0
                    ;;
                --mysql-ca-cert)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --mysql-client-cert)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --mysql-client-key)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                *)
                    COMPREPLY=()
                    ;;
            esac
            COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
            return 0
            ;;
        seckill__subcmd__generate)
            opts="-v -q -h -V --out-dir --redis-url --mysql-url --prefix --connect-timeout --redis-password-file --mysql-password-file --redis-ca-cert --redis-client-cert --redis-client-key --mysql-ssl-mode --mysql-ca-cert --mysql-client-cert --mysql-client-key --verbose --quiet --help --version"
            if [[ ${cur} == -* || ${COMP_CWORD} -eq 2 ]] ; then
                COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
                return 0
            fi
            case "${prev}" in
                --out-dir)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --redis-url)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --mysql-url)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --prefix)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --connect-timeout)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --redis-password-file)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --mysql-password-file)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --redis-ca-cert)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --redis-client-cert)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --redis-client-key)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --mysql-ssl-mode)
                    COMPREPLY=($(compgen -W "disabled preferred required verify-ca verify-identity" -- "${cur}"))
                    return 0
                    ;;
                --mysql-ca-cert)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --mysql-client-cert)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --mysql-client-key)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                *)
                    COMPREPLY=()
                    ;;
            esac
            COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
            return 0
            ;;
        seckill__subcmd__help)
            opts="init status voucher preload buy bench token worker serve pending pay order waitlist reconcile doctor generate help"
            if [[ ${cur} == -* || ${COMP_CWORD} -eq 2 ]] ; then
                COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
                return 0
            fi
            case "${prev}" in
                *)
                    COMPREPLY=()
                    ;;
            esac
            COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
            return 0
            ;;
        seckill__subcmd__help__subcmd__bench)
            opts=""
            if [[ ${cur} == -* || ${COMP_CWORD} -eq 3 ]] ; then
                COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
                return 0
            fi
            case "${prev}" in
                *)
                    COMPREPLY=()
                    ;;
            esac
            COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
            return 0
            ;;
        seckill__subcmd__help__subcmd__buy)
            opts=""
            if [[ ${cur} == -* || ${COMP_CWORD} -eq 3 ]] ; then
                COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
                return 0
            fi
            case "${prev}" in
                *)
                    COMPREPLY=()
                    ;;
            esac
            COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
            return 0
            ;;
        seckill__subcmd__help__subcmd__doctor)
            opts=""
            if [[ ${cur} == -* || ${COMP_CWORD} -eq 3 ]] ; then
                COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
                return 0
            fi
            case "${prev}" in
                *)
                    COMPREPLY=()
                    ;;
            esac
            COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
            return 0
            ;;
        seckill__subcmd__help__subcmd__generate)
            opts=""
            if [[ ${cur} == -* || ${COMP_CWORD} -eq 3 ]] ; then
                COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
                return 0
            fi
            case "${prev}" in
                *)
                    COMPREPLY=()
                    ;;
            esac
            COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
            return 0
            ;;
        seckill__subcmd__help__subcmd__help)
            opts=""
            if [[ ${cur} == -* || ${COMP_CWORD} -eq 3 ]] ; then
                COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
                return 0
            fi
            case "${prev}" in
                *)
                    COMPREPLY=()
                    ;;
            esac
            COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
            return 0
            ;;
        seckill__subcmd__help__subcmd__init)
            opts=""
            if [[ ${cur} == -* || ${COMP_CWORD} -eq 3 ]] ; then
                COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
                return 0
            fi
            case "${prev}" in
                *)
                    COMPREPLY=()
                    ;;
            esac
            COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
            return 0
            ;;
        seckill__subcmd__help__subcmd__order)
            opts="show unhold"
            if [[ ${cur} == -* || ${COMP_CWORD} -eq 3 ]] ; then
                COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
                return 0
            fi
            case "${prev}" in
                *)
                    COMPREPLY=()
                    ;;
            esac
            COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
            return 0
            ;;
        seckill__subcmd__help__subcmd__order__subcmd__show)
            opts=""
            if [[ ${cur} == -* || ${COMP_CWORD} -eq 4 ]] ; then
                COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
                return 0
            fi
            case "${prev}" in
                *)
                    COMPREPLY=()
                    ;;
            esac
            COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
            return 0
            ;;
        seckill__subcmd__help__subcmd__order__subcmd__unhold)
            opts=""
            if [[ ${cur} == -* || ${COMP_CWORD} -eq 4 ]] ; then
                COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
                return 0
            fi
            case "${prev}" in
                *)
                    COMPREPLY=()
                    ;;
            esac
            COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
            return 0
            ;;
        seckill__subcmd__help__subcmd__pay)
            opts=""
            if [[ ${cur} == -* || ${COMP_CWORD} -eq 3 ]] ; then
                COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
                return 0
            fi
            case "${prev}" in
                *)
                    COMPREPLY=()
                    ;;
            esac
            COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
            return 0
            ;;
        seckill__subcmd__help__subcmd__pending)
            opts=""
            if [[ ${cur} == -* || ${COMP_CWORD} -eq 3 ]] ; then
                COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
                return 0
            fi
            case "${prev}" in
                *)
                    COMPREPLY=()
                    ;;
            esac
            COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
            return 0
            ;;
        seckill__subcmd__help__subcmd__preload)
            opts=""
            if [[ ${cur} == -* || ${COMP_CWORD} -eq 3 ]] ; then
                COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
                return 0
            fi
            case "${prev}" in
                *)
                    COMPREPLY=()
                    ;;
            esac
            COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
            return 0
            ;;
        seckill__subcmd__help__subcmd__reconcile)
            opts=""
            if [[ ${cur} == -* || ${COMP_CWORD} -eq 3 ]] ; then
                COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
                return 0
            fi
            case "${prev}" in
                *)
                    COMPREPLY=()
                    ;;
            esac
            COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
            return 0
            ;;
        seckill__subcmd__help__subcmd__serve)
            opts=""
            if [[ ${cur} == -* || ${COMP_CWORD} -eq 3 ]] ; then
                COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
                return 0
            fi
            case "${prev}" in
                *)
                    COMPREPLY=()
                    ;;
            esac
            COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
            return 0
            ;;
        seckill__subcmd__help__subcmd__status)
            opts=""
            if [[ ${cur} == -* || ${COMP_CWORD} -eq 3 ]] ; then
                COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
                return 0
            fi
            case "${prev}" in
                *)
                    COMPREPLY=()
                    ;;
            esac
            COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
            return 0
            ;;
        seckill__subcmd__help__subcmd__token)
            opts="issue"
            if [[ ${cur} == -* || ${COMP_CWORD} -eq 3 ]] ; then
                COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
                return 0
            fi
            case "${prev}" in
                *)
                    COMPREPLY=()
                    ;;
            esac
            COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
            return 0
            ;;
        seckill__subcmd__help__subcmd__token__subcmd__issue)
            opts=""
            if [[ ${cur} == -* || ${COMP_CWORD} -eq 4 ]] ; then
                COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
                return 0
            fi
            case "${prev}" in
                *)
                    COMPREPLY=()
                    ;;
            esac
            COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
            return 0
            ;;
        seckill__subcmd__help__subcmd__voucher)
            opts="add update list"
            if [[ ${cur} == -* || ${COMP_CWORD} -eq 3 ]] ; then
                COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
                return 0
            fi
            case "${prev}" in
                *)
                    COMPREPLY=()
                    ;;
            esac
            COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
            return 0
            ;;
        seckill__subcmd__help__subcmd__voucher__subcmd__add)
            opts=""
            if [[ ${cur} == -* || ${COMP_CWORD} -eq 4 ]] ; then
                COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
                return 0
            fi
            case "${prev}" in
                *)
                    COMPREPLY=()
                    ;;
            esac
            COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
            return 0
            ;;
        seckill__subcmd__help__subcmd__voucher__subcmd__list)
            opts=""
            if [[ ${cur} == -* || ${COMP_CWORD} -eq 4 ]] ; then
                COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
                return 0
            fi
            case "${prev}" in
                *)
                    COMPREPLY=()
                    ;;
            esac
            COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
            return 0
            ;;
        seckill__subcmd__help__subcmd__voucher__subcmd__update)
            opts=""
            if [[ ${cur} == -* || ${COMP_CWORD} -eq 4 ]] ; then
                COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
                return 0
            fi
            case "${prev}" in
                *)
                    COMPREPLY=()
                    ;;
            esac
            COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
            return 0
            ;;
        seckill__subcmd__help__subcmd__waitlist)
            opts=""
            if [[ ${cur} == -* || ${COMP_CWORD} -eq 3 ]] ; then
                COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
                return 0
            fi
            case "${prev}" in
                *)
                    COMPREPLY=()
                    ;;
            esac
            COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
            return 0
            ;;
        seckill__subcmd__help__subcmd__worker)
            opts=""
            if [[ ${cur} == -* || ${COMP_CWORD} -eq 3 ]] ; then
                COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
                return 0
            fi
            case "${prev}" in
                *)
                    COMPREPLY=()
                    ;;
            esac
            COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
            return 0
            ;;
        seckill__subcmd__init)
            opts="-v -q -h -V --format --redis-url --mysql-url --prefix --connect-timeout --redis-password-file --mysql-password-file --redis-ca-cert --redis-client-cert --redis-client-key --mysql-ssl-mode --mysql-ca-cert --mysql-client-cert --mysql-client-key --verbose --quiet --help --version"
            if [[ ${cur} == -* || ${COMP_CWORD} -eq 2 ]] ; then
                COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
                return 0
            fi
            case "${prev}" in
                --format)
                    COMPREPLY=($(compgen -W "table json" -- "${cur}"))
                    return 0
                    ;;
                --redis-url)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --mysql-url)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --prefix)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --connect-timeout)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --redis-password-file)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --mysql-password-file)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --redis-ca-cert)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --redis-client-cert)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --redis-client-key)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --mysql-ssl-mode)
                    COMPREPLY=($(compgen -W "disabled preferred required verify-ca verify-identity" -- "${cur}"))
                    return 0
                    ;;
                --mysql-ca-cert)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --mysql-client-cert)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --mysql-client-key)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                *)
                    COMPREPLY=()
                    ;;
            esac
            COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
            return 0
            ;;
        seckill__subcmd__order)
            opts="-v -q -h -V --redis-url --mysql-url --prefix --connect-timeout --redis-password-file --mysql-password-file --redis-ca-cert --redis-client-cert --redis-client-key --mysql-ssl-mode --mysql-ca-cert --mysql-client-cert --mysql-client-key --verbose --quiet --help --version show unhold help"
            if [[ ${cur} == -* || ${COMP_CWORD} -eq 2 ]] ; then
                COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
                return 0
            fi
            case "${prev}" in
                --redis-url)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --mysql-url)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --prefix)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --connect-timeout)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --redis-password-file)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --mysql-password-file)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --redis-ca-cert)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --redis-client-cert)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --redis-client-key)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --mysql-ssl-mode)
                    COMPREPLY=($(compgen -W "disabled preferred required verify-ca verify-identity" -- "${cur}"))
                    return 0
                    ;;
                --mysql-ca-cert)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --mysql-client-cert)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --mysql-client-key)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                *)
                    COMPREPLY=()
                    ;;
            esac
            COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
            return 0
            ;;
        seckill__subcmd__order__subcmd__help)
            opts="show unhold help"
            if [[ ${cur} == -* || ${COMP_CWORD} -eq 3 ]] ; then
                COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
                return 0
            fi
            case "${prev}" in
                *)
                    COMPREPLY=()
                    ;;
            esac
            COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
            return 0
            ;;
        seckill__subcmd__order__subcmd__help__subcmd__help)
            opts=""
            if [[ ${cur} == -* || ${COMP_CWORD} -eq 4 ]] ; then
                COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
                return 0
            fi
            case "${prev}" in
                *)
                    COMPREPLY=()
                    ;;
            esac
            COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
            return 0
            ;;
        seckill__subcmd__order__subcmd__help__subcmd__show)
            opts=""
            if [[ ${cur} == -* || ${COMP_CWORD} -eq 4 ]] ; then
                COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
                return 0
            fi
            case "${prev}" in
                *)
                    COMPREPLY=()
                    ;;
            esac
            COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
            return 0
            ;;
        seckill__subcmd__order__subcmd__help__subcmd__unhold)
            opts=""
            if [[ ${cur} == -* || ${COMP_CWORD} -eq 4 ]] ; then
                COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
                return 0
            fi
            case "${prev}" in
                *)
                    COMPREPLY=()
                    ;;
            esac
            COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
            return 0
            ;;
        seckill__subcmd__order__subcmd__show)
            opts="-v -q -h -V --format --redis-url --mysql-url --prefix --connect-timeout --redis-password-file --mysql-password-file --redis-ca-cert --redis-client-cert --redis-client-key --mysql-ssl-mode --mysql-ca-cert --mysql-client-cert --mysql-client-key --verbose --quiet --help --version"
            if [[ ${cur} == -* || ${COMP_CWORD} -eq 3 ]] ; then
                COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
                return 0
            fi
            case "${prev}" in
                --format)
                    COMPREPLY=($(compgen -W "table json" -- "${cur}"))
                    return 0
                    ;;
                --redis-url)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --mysql-url)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --prefix)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --connect-timeout)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --redis-password-file)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --mysql-password-file)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --redis-ca-cert)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --redis-client-cert)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --redis-client-key)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --mysql-ssl-mode)
                    COMPREPLY=($(compgen -W "disabled preferred required verify-ca verify-identity" -- "${cur}"))
                    return 0
                    ;;
                --mysql-ca-cert)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --mysql-client-cert)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --mysql-client-key)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                *)
                    COMPREPLY=()
                    ;;
            esac
            COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
            return 0
            ;;
        seckill__subcmd__order__subcmd__unhold)
            opts="-v -q -h -V --order --redis-url --mysql-url --prefix --connect-timeout --redis-password-file --mysql-password-file --redis-ca-cert --redis-client-cert --redis-client-key --mysql-ssl-mode --mysql-ca-cert --mysql-client-cert --mysql-client-key --verbose --quiet --help --version"
            if [[ ${cur} == -* || ${COMP_CWORD} -eq 3 ]] ; then
                COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
                return 0
            fi
            case "${prev}" in
                --order)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --redis-url)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --mysql-url)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --prefix)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --connect-timeout)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --redis-password-file)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --mysql-password-file)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --redis-ca-cert)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --redis-client-cert)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --redis-client-key)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --mysql-ssl-mode)
                    COMPREPLY=($(compgen -W "disabled preferred required verify-ca verify-identity" -- "${cur}"))
                    return 0
                    ;;
                --mysql-ca-cert)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --mysql-client-cert)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --mysql-client-key)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                *)
                    COMPREPLY=()
                    ;;
            esac
            COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
            return 0
            ;;
        seckill__subcmd__pay)
            opts="-v -q -h -V --order --format --redis-url --mysql-url --prefix --connect-timeout --redis-password-file --mysql-password-file --redis-ca-cert --redis-client-cert --redis-client-key --mysql-ssl-mode --mysql-ca-cert --mysql-client-cert --mysql-client-key --verbose --quiet --help --version"
            if [[ ${cur} == -* || ${COMP_CWORD} -eq 2 ]] ; then
                COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
                return 0
            fi
            case "${prev}" in
                --order)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --format)
                    COMPREPLY=($(compgen -W "table json" -- "${cur}"))
                    return 0
                    ;;
                --redis-url)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --mysql-url)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --prefix)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --connect-timeout)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --redis-password-file)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --mysql-password-file)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --redis-ca-cert)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --redis-client-cert)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --redis-client-key)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --mysql-ssl-mode)
                    COMPREPLY=($(compgen -W "disabled preferred required verify-ca verify-identity" -- "${cur}"))
                    return 0
                    ;;
                --mysql-ca-cert)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --mysql-client-cert)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --mysql-client-key)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                *)
                    COMPREPLY=()
                    ;;
            esac
            COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
            return 0
            ;;
        seckill__subcmd__pending)
            opts="-y -v -q -h -V --voucher --limit --requeue --entry --yes --format --redis-url --mysql-url --prefix --connect-timeout --redis-password-file --mysql-password-file --redis-ca-cert --redis-client-cert --redis-client-key --mysql-ssl-mode --mysql-ca-cert --mysql-client-cert --mysql-client-key --verbose --quiet --help --version"
            if [[ ${cur} == -* || ${COMP_CWORD} -eq 2 ]] ; then
                COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
                return 0
            fi
            case "${prev}" in
                --voucher)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --limit)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --entry)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --format)
                    COMPREPLY=($(compgen -W "table json" -- "${cur}"))
                    return 0
                    ;;
                --redis-url)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --mysql-url)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --prefix)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --connect-timeout)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --redis-password-file)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --mysql-password-file)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --redis-ca-cert)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --redis-client-cert)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --redis-client-key)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --mysql-ssl-mode)
                    COMPREPLY=($(compgen -W "disabled preferred required verify-ca verify-identity" -- "${cur}"))
                    return 0
                    ;;
                --mysql-ca-cert)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --mysql-client-cert)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --mysql-client-key)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                *)
                    COMPREPLY=()
                    ;;
            esac
            COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
            return 0
            ;;
        seckill__subcmd__preload)
            opts="-v -q -h -V --voucher --all --force --format --redis-url --mysql-url --prefix --connect-timeout --redis-password-file --mysql-password-file --redis-ca-cert --redis-client-cert --redis-client-key --mysql-ssl-mode --mysql-ca-cert --mysql-client-cert --mysql-client-key --verbose --quiet --help --version"
            if [[ ${cur} == -* || ${COMP_CWORD} -eq 2 ]] ; then
                COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
                return 0
            fi
            case "${prev}" in
                --voucher)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --format)
                    COMPREPLY=($(compgen -W "table json" -- "${cur}"))
                    return 0
                    ;;
                --redis-url)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --mysql-url)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --prefix)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --connect-timeout)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --redis-password-file)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --mysql-password-file)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --redis-ca-cert)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --redis-client-cert)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --redis-client-key)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --mysql-ssl-mode)
                    COMPREPLY=($(compgen -W "disabled preferred required verify-ca verify-identity" -- "${cur}"))
                    return 0
                    ;;
                --mysql-ca-cert)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --mysql-client-cert)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --mysql-client-key)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                *)
                    COMPREPLY=()
                    ;;
            esac
            COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
            return 0
            ;;
        seckill__subcmd__reconcile)
            opts="-y -v -q -h -V --voucher --dry-run --fix-mysql --deep --drop-lost-commits --attempts --settle --yes --node-id --format --redis-url --mysql-url --prefix --connect-timeout --redis-password-file --mysql-password-file --redis-ca-cert --redis-client-cert --redis-client-key --mysql-ssl-mode --mysql-ca-cert --mysql-client-cert --mysql-client-key --verbose --quiet --help --version"
            if [[ ${cur} == -* || ${COMP_CWORD} -eq 2 ]] ; then
                COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
                return 0
            fi
            case "${prev}" in
                --voucher)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --drop-lost-commits)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --attempts)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --settle)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --node-id)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --format)
                    COMPREPLY=($(compgen -W "table json" -- "${cur}"))
                    return 0
                    ;;
                --redis-url)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --mysql-url)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --prefix)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --connect-timeout)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --redis-password-file)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --mysql-password-file)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --redis-ca-cert)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --redis-client-cert)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --redis-client-key)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --mysql-ssl-mode)
                    COMPREPLY=($(compgen -W "disabled preferred required verify-ca verify-identity" -- "${cur}"))
                    return 0
                    ;;
                --mysql-ca-cert)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --mysql-client-cert)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --mysql-client-key)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                *)
                    COMPREPLY=()
                    ;;
            esac
            COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
            return 0
            ;;
        seckill__subcmd__serve)
            opts="-v -q -h -V --listen --api-key-file --max-in-flight --request-timeout --header-timeout --idle-timeout --max-connections --drain --redis-connections --tls-cert --tls-key --metrics-addr --idempotency-ttl --wait-replicas --wait-timeout --node-id --redis-url --mysql-url --prefix --connect-timeout --redis-password-file --mysql-password-file --redis-ca-cert --redis-client-cert --redis-client-key --mysql-ssl-mode --mysql-ca-cert --mysql-client-cert --mysql-client-key --verbose --quiet --help --version"
            if [[ ${cur} == -* || ${COMP_CWORD} -eq 2 ]] ; then
                COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
                return 0
            fi
            case "${prev}" in
                --listen)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --api-key-file)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --max-in-flight)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --request-timeout)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --header-timeout)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --idle-timeout)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --max-connections)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --drain)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --redis-connections)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --tls-cert)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --tls-key)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --metrics-addr)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --idempotency-ttl)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --wait-replicas)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --wait-timeout)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --node-id)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --redis-url)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --mysql-url)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --prefix)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --connect-timeout)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --redis-password-file)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --mysql-password-file)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --redis-ca-cert)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --redis-client-cert)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --redis-client-key)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --mysql-ssl-mode)
                    COMPREPLY=($(compgen -W "disabled preferred required verify-ca verify-identity" -- "${cur}"))
                    return 0
                    ;;
                --mysql-ca-cert)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --mysql-client-cert)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --mysql-client-key)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                *)
                    COMPREPLY=()
                    ;;
            esac
            COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
            return 0
            ;;
        seckill__subcmd__status)
            opts="-v -q -h -V --voucher --watch --format --redis-url --mysql-url --prefix --connect-timeout --redis-password-file --mysql-password-file --redis-ca-cert --redis-client-cert --redis-client-key --mysql-ssl-mode --mysql-ca-cert --mysql-client-cert --mysql-client-key --verbose --quiet --help --version"
            if [[ ${cur} == -* || ${COMP_CWORD} -eq 2 ]] ; then
                COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
                return 0
            fi
            case "${prev}" in
                --voucher)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --watch)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --format)
                    COMPREPLY=($(compgen -W "table json" -- "${cur}"))
                    return 0
                    ;;
                --redis-url)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --mysql-url)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --prefix)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --connect-timeout)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --redis-password-file)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --mysql-password-file)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --redis-ca-cert)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --redis-client-cert)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --redis-client-key)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --mysql-ssl-mode)
                    COMPREPLY=($(compgen -W "disabled preferred required verify-ca verify-identity" -- "${cur}"))
                    return 0
                    ;;
                --mysql-ca-cert)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --mysql-client-cert)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --mysql-client-key)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                *)
                    COMPREPLY=()
                    ;;
            esac
            COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
            return 0
            ;;
        seckill__subcmd__token)
            opts="-v -q -h -V --redis-url --mysql-url --prefix --connect-timeout --redis-password-file --mysql-password-file --redis-ca-cert --redis-client-cert --redis-client-key --mysql-ssl-mode --mysql-ca-cert --mysql-client-cert --mysql-client-key --verbose --quiet --help --version issue help"
            if [[ ${cur} == -* || ${COMP_CWORD} -eq 2 ]] ; then
                COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
                return 0
            fi
            case "${prev}" in
                --redis-url)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --mysql-url)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --prefix)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --connect-timeout)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --redis-password-file)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --mysql-password-file)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --redis-ca-cert)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --redis-client-cert)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --redis-client-key)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --mysql-ssl-mode)
                    COMPREPLY=($(compgen -W "disabled preferred required verify-ca verify-identity" -- "${cur}"))
                    return 0
                    ;;
                --mysql-ca-cert)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --mysql-client-cert)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --mysql-client-key)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                *)
                    COMPREPLY=()
                    ;;
            esac
            COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
            return 0
            ;;
        seckill__subcmd__token__subcmd__help)
            opts="issue help"
            if [[ ${cur} == -* || ${COMP_CWORD} -eq 3 ]] ; then
                COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
                return 0
            fi
            case "${prev}" in
                *)
                    COMPREPLY=()
                    ;;
            esac
            COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
            return 0
            ;;
        seckill__subcmd__token__subcmd__help__subcmd__help)
            opts=""
            if [[ ${cur} == -* || ${COMP_CWORD} -eq 4 ]] ; then
                COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
                return 0
            fi
            case "${prev}" in
                *)
                    COMPREPLY=()
                    ;;
            esac
            COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
            return 0
            ;;
        seckill__subcmd__token__subcmd__help__subcmd__issue)
            opts=""
            if [[ ${cur} == -* || ${COMP_CWORD} -eq 4 ]] ; then
                COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
                return 0
            fi
            case "${prev}" in
                *)
                    COMPREPLY=()
                    ;;
            esac
            COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
            return 0
            ;;
        seckill__subcmd__token__subcmd__issue)
            opts="-v -q -h -V --voucher --user --ttl --format --redis-url --mysql-url --prefix --connect-timeout --redis-password-file --mysql-password-file --redis-ca-cert --redis-client-cert --redis-client-key --mysql-ssl-mode --mysql-ca-cert --mysql-client-cert --mysql-client-key --verbose --quiet --help --version"
            if [[ ${cur} == -* || ${COMP_CWORD} -eq 3 ]] ; then
                COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
                return 0
            fi
            case "${prev}" in
                --voucher)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --user)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --ttl)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --format)
                    COMPREPLY=($(compgen -W "table json" -- "${cur}"))
                    return 0
                    ;;
                --redis-url)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --mysql-url)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --prefix)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --connect-timeout)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --redis-password-file)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --mysql-password-file)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --redis-ca-cert)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --redis-client-cert)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --redis-client-key)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --mysql-ssl-mode)
                    COMPREPLY=($(compgen -W "disabled preferred required verify-ca verify-identity" -- "${cur}"))
                    return 0
                    ;;
                --mysql-ca-cert)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --mysql-client-cert)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --mysql-client-key)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                *)
                    COMPREPLY=()
                    ;;
            esac
            COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
            return 0
            ;;
        seckill__subcmd__voucher)
            opts="-v -q -h -V --redis-url --mysql-url --prefix --connect-timeout --redis-password-file --mysql-password-file --redis-ca-cert --redis-client-cert --redis-client-key --mysql-ssl-mode --mysql-ca-cert --mysql-client-cert --mysql-client-key --verbose --quiet --help --version add update list help"
            if [[ ${cur} == -* || ${COMP_CWORD} -eq 2 ]] ; then
                COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
                return 0
            fi
            case "${prev}" in
                --redis-url)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --mysql-url)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --prefix)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --connect-timeout)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --redis-password-file)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --mysql-password-file)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --redis-ca-cert)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --redis-client-cert)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --redis-client-key)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --mysql-ssl-mode)
                    COMPREPLY=($(compgen -W "disabled preferred required verify-ca verify-identity" -- "${cur}"))
                    return 0
                    ;;
                --mysql-ca-cert)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --mysql-client-cert)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --mysql-client-key)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                *)
                    COMPREPLY=()
                    ;;
            esac
            COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
            return 0
            ;;
        seckill__subcmd__voucher__subcmd__add)
            opts="-v -q -h -V --id --stock --begin --end --pay-timeout --title --user-rate --require-token --per-user-limit --waitlist-limit --buckets --format --redis-url --mysql-url --prefix --connect-timeout --redis-password-file --mysql-password-file --redis-ca-cert --redis-client-cert --redis-client-key --mysql-ssl-mode --mysql-ca-cert --mysql-client-cert --mysql-client-key --verbose --quiet --help --version"
            if [[ ${cur} == -* || ${COMP_CWORD} -eq 3 ]] ; then
                COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
                return 0
            fi
            case "${prev}" in
                --id)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --stock)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --begin)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --end)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --pay-timeout)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --title)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --user-rate)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --per-user-limit)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --waitlist-limit)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --buckets)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --format)
                    COMPREPLY=($(compgen -W "table json" -- "${cur}"))
                    return 0
                    ;;
                --redis-url)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --mysql-url)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --prefix)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --connect-timeout)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --redis-password-file)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --mysql-password-file)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --redis-ca-cert)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --redis-client-cert)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --redis-client-key)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --mysql-ssl-mode)
                    COMPREPLY=($(compgen -W "disabled preferred required verify-ca verify-identity" -- "${cur}"))
                    return 0
                    ;;
                --mysql-ca-cert)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --mysql-client-cert)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --mysql-client-key)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                *)
                    COMPREPLY=()
                    ;;
            esac
            COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
            return 0
            ;;
        seckill__subcmd__voucher__subcmd__help)
            opts="add update list help"
            if [[ ${cur} == -* || ${COMP_CWORD} -eq 3 ]] ; then
                COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
                return 0
            fi
            case "${prev}" in
                *)
                    COMPREPLY=()
                    ;;
            esac
            COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
            return 0
            ;;
        seckill__subcmd__voucher__subcmd__help__subcmd__add)
            opts=""
            if [[ ${cur} == -* || ${COMP_CWORD} -eq 4 ]] ; then
                COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
                return 0
            fi
            case "${prev}" in
                *)
                    COMPREPLY=()
                    ;;
            esac
            COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
            return 0
            ;;
        seckill__subcmd__voucher__subcmd__help__subcmd__help)
            opts=""
            if [[ ${cur} == -* || ${COMP_CWORD} -eq 4 ]] ; then
                COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
                return 0
            fi
            case "${prev}" in
                *)
                    COMPREPLY=()
                    ;;
            esac
            COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
            return 0
            ;;
        seckill__subcmd__voucher__subcmd__help__subcmd__list)
            opts=""
            if [[ ${cur} == -* || ${COMP_CWORD} -eq 4 ]] ; then
                COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
                return 0
            fi
            case "${prev}" in
                *)
                    COMPREPLY=()
                    ;;
            esac
            COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
            return 0
            ;;
        seckill__subcmd__voucher__subcmd__help__subcmd__update)
            opts=""
            if [[ ${cur} == -* || ${COMP_CWORD} -eq 4 ]] ; then
                COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
                return 0
            fi
            case "${prev}" in
                *)
                    COMPREPLY=()
                    ;;
            esac
            COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
            return 0
            ;;
        seckill__subcmd__voucher__subcmd__list)
            opts="-v -q -h -V --voucher --format --redis-url --mysql-url --prefix --connect-timeout --redis-password-file --mysql-password-file --redis-ca-cert --redis-client-cert --redis-client-key --mysql-ssl-mode --mysql-ca-cert --mysql-client-cert --mysql-client-key --verbose --quiet --help --version"
            if [[ ${cur} == -* || ${COMP_CWORD} -eq 3 ]] ; then
                COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
                return 0
            fi
            case "${prev}" in
                --voucher)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --format)
                    COMPREPLY=($(compgen -W "table json" -- "${cur}"))
                    return 0
                    ;;
                --redis-url)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --mysql-url)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --prefix)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --connect-timeout)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --redis-password-file)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --mysql-password-file)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --redis-ca-cert)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --redis-client-cert)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --redis-client-key)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --mysql-ssl-mode)
                    COMPREPLY=($(compgen -W "disabled preferred required verify-ca verify-identity" -- "${cur}"))
                    return 0
                    ;;
                --mysql-ca-cert)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --mysql-client-cert)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --mysql-client-key)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                *)
                    COMPREPLY=()
                    ;;
            esac
            COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
            return 0
            ;;
        seckill__subcmd__voucher__subcmd__update)
            opts="-v -q -h -V --id --user-rate --require-token --no-require-token --per-user-limit --waitlist-limit --no-waitlist-limit --buckets --format --redis-url --mysql-url --prefix --connect-timeout --redis-password-file --mysql-password-file --redis-ca-cert --redis-client-cert --redis-client-key --mysql-ssl-mode --mysql-ca-cert --mysql-client-cert --mysql-client-key --verbose --quiet --help --version"
            if [[ ${cur} == -* || ${COMP_CWORD} -eq 3 ]] ; then
                COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
                return 0
            fi
            case "${prev}" in
                --id)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --user-rate)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --per-user-limit)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --waitlist-limit)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --buckets)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --format)
                    COMPREPLY=($(compgen -W "table json" -- "${cur}"))
                    return 0
                    ;;
                --redis-url)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --mysql-url)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --prefix)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --connect-timeout)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --redis-password-file)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --mysql-password-file)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --redis-ca-cert)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --redis-client-cert)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --redis-client-key)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --mysql-ssl-mode)
                    COMPREPLY=($(compgen -W "disabled preferred required verify-ca verify-identity" -- "${cur}"))
                    return 0
                    ;;
                --mysql-ca-cert)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --mysql-client-cert)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --mysql-client-key)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                *)
                    COMPREPLY=()
                    ;;
            esac
            COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
            return 0
            ;;
        seckill__subcmd__waitlist)
            opts="-v -q -h -V --voucher --limit --format --redis-url --mysql-url --prefix --connect-timeout --redis-password-file --mysql-password-file --redis-ca-cert --redis-client-cert --redis-client-key --mysql-ssl-mode --mysql-ca-cert --mysql-client-cert --mysql-client-key --verbose --quiet --help --version"
            if [[ ${cur} == -* || ${COMP_CWORD} -eq 2 ]] ; then
                COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
                return 0
            fi
            case "${prev}" in
                --voucher)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --limit)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --format)
                    COMPREPLY=($(compgen -W "table json" -- "${cur}"))
                    return 0
                    ;;
                --redis-url)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --mysql-url)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --prefix)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --connect-timeout)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --redis-password-file)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --mysql-password-file)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --redis-ca-cert)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --redis-client-cert)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --redis-client-key)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --mysql-ssl-mode)
                    COMPREPLY=($(compgen -W "disabled preferred required verify-ca verify-identity" -- "${cur}"))
                    return 0
                    ;;
                --mysql-ca-cert)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --mysql-client-cert)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --mysql-client-key)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                *)
                    COMPREPLY=()
                    ;;
            esac
            COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
            return 0
            ;;
        seckill__subcmd__worker)
            opts="-v -q -h -V --consumer --batch --max-batch --block --claim-idle --max-deliveries --lock-lease --mysql-timeout --keep --lanes --deadline-lease --sweep-every --sweep-grace --gate-check --node-id --metrics-addr --until-idle --format --redis-url --mysql-url --prefix --connect-timeout --redis-password-file --mysql-password-file --redis-ca-cert --redis-client-cert --redis-client-key --mysql-ssl-mode --mysql-ca-cert --mysql-client-cert --mysql-client-key --verbose --quiet --help --version"
            if [[ ${cur} == -* || ${COMP_CWORD} -eq 2 ]] ; then
                COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
                return 0
            fi
            case "${prev}" in
                --consumer)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --batch)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --max-batch)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --block)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --claim-idle)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --max-deliveries)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --lock-lease)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --mysql-timeout)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --keep)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --lanes)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --deadline-lease)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --sweep-every)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --sweep-grace)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --gate-check)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --node-id)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --metrics-addr)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --format)
                    COMPREPLY=($(compgen -W "table json" -- "${cur}"))
                    return 0
                    ;;
                --redis-url)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --mysql-url)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --prefix)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --connect-timeout)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --redis-password-file)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --mysql-password-file)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --redis-ca-cert)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --redis-client-cert)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --redis-client-key)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --mysql-ssl-mode)
                    COMPREPLY=($(compgen -W "disabled preferred required verify-ca verify-identity" -- "${cur}"))
                    return 0
                    ;;
                --mysql-ca-cert)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --mysql-client-cert)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --mysql-client-key)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                *)
                    COMPREPLY=()
                    ;;
            esac
            COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
            return 0
            ;;
    esac
}

if [[ "${BASH_VERSINFO[0]}" -eq 4 && "${BASH_VERSINFO[1]}" -ge 4 || "${BASH_VERSINFO[0]}" -gt 4 ]]; then
    complete -F _seckill -o nosort -o bashdefault -o default seckill
else
    complete -F _seckill -o bashdefault -o default seckill
fi
