//! How many connections the process can hold: `--max-connections`, kept
//! below the descriptor limit by what the stores and files need, so that a
//! flood of connections meets the cap (where idle and slow ones are shed)
//! before it meets the limit (where accept fails and nobody gets in).

use crate::error::{Error, Result};

/// Descriptors kept back from connections: the MySQL pool's ceiling
/// (mysql_async's default, 100), the listeners, the log, the key file,
/// a Redis reconnect's new socket before the old one closes, tokio's
/// own, the metrics page's connections (32 in all), refused newcomers
/// being answered (`super::LINGERING`), and a burst's passing of the cap
/// while the connections shed for it close (`super::BATCH`).
/// Per shared Redis connection, four (a purchase pool beside the shared
/// one, and a replacement of each while the mender mends).
const KEPT_BACK: u64 = 100 + 32 + (super::LINGERING + super::BATCH) as u64;
const PER_REDIS_CONNECTION: u64 = 4;

/// The cap in force and where it came from (said in serve's first line).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConnectionCap {
    pub connections: usize,
    /// The process's descriptor limit (soft), after raising it.
    pub descriptors: u64,
    pub kept_back: u64,
}

/// Raises the soft descriptor limit as far as the hard one allows (and no
/// further than the cap needs: systemd's default soft limit is 1,024, its
/// hard one far more), then the cap that fits under it.
pub fn connection_cap(max_connections: usize, redis_connections: usize) -> Result<ConnectionCap> {
    let kept_back = KEPT_BACK + PER_REDIS_CONNECTION * redis_connections as u64;
    let wanted = max_connections as u64 + kept_back;
    let descriptors = raise_soft_limit(wanted)?;
    let room = descriptors.saturating_sub(kept_back);
    if room == 0 {
        return Err(Error::InvalidInput(format!(
            "the descriptor limit ({descriptors}) leaves no room for connections after the {kept_back} kept for the stores: raise it (LimitNOFILE= in the unit, ulimit -n)"
        )));
    }
    Ok(ConnectionCap {
        connections: (max_connections as u64).min(room) as usize,
        descriptors,
        kept_back,
    })
}

/// The soft limit after raising it towards `wanted` (never lowering it).
fn raise_soft_limit(wanted: u64) -> Result<u64> {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes the struct it is given and nothing else.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) } != 0 {
        return Err(Error::InvalidInput(format!(
            "cannot read the descriptor limit: {}",
            std::io::Error::last_os_error()
        )));
    }
    let (soft, hard): (u64, u64) = (limit.rlim_cur, limit.rlim_max);
    let target = wanted.min(hard);
    if target <= soft {
        return Ok(soft);
    }
    let raised = libc::rlimit {
        rlim_cur: target,
        rlim_max: limit.rlim_max,
    };
    // SAFETY: setrlimit reads the struct it is given; a soft limit up to
    // the hard one needs no privilege.
    if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &raised) } != 0 {
        tracing::warn!(
            "cannot raise the descriptor limit from {soft} to {target}: {}",
            std::io::Error::last_os_error()
        );
        return Ok(soft);
    }
    Ok(target)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cap_stays_below_the_limit_by_what_the_stores_need() {
        let small = connection_cap(10, 4).unwrap();
        assert_eq!(small.kept_back, 164 + 16);
        assert!(small.connections <= 10);
        assert!(small.connections as u64 <= small.descriptors - small.kept_back);
        if let Ok(cap) = connection_cap(1_000_000_000, 4) {
            assert_eq!(cap.connections as u64, cap.descriptors - cap.kept_back);
        }
    }
}
