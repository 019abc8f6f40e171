//! One place owns the process's signals: SIGINT or SIGTERM cancels the token
//! that long-running loops race their waits against; a second signal exits
//! at once. Tests cancel the token themselves instead.

use tokio::signal::unix::{signal, SignalKind};
use tokio_util::sync::CancellationToken;

/// A token cancelled by the first SIGINT/SIGTERM.
pub fn on_signals() -> std::io::Result<CancellationToken> {
    let token = CancellationToken::new();
    let mut term = signal(SignalKind::terminate())?;
    let mut int = signal(SignalKind::interrupt())?;
    let cancel = token.clone();
    tokio::spawn(async move {
        let name = tokio::select! {
            _ = term.recv() => "SIGTERM",
            _ = int.recv() => "SIGINT",
        };
        tracing::info!("{name}: stopping after the batch in hand (send again to exit now)");
        cancel.cancel();
        tokio::select! {
            _ = term.recv() => {},
            _ = int.recv() => {},
        }
        tracing::warn!(
            "second signal: exiting now; unfinished entries stay pending for another worker"
        );
        std::process::exit(1);
    });
    Ok(token)
}
