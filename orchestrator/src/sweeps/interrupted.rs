//! What `shardrun sweep` says when a signal (Ctrl-C, a closed terminal, `kill`) ends it while
//! it submits: its arrays stand, and the next `shardrun sweep` finishes what it left (its
//! journal says which arrays were held or not yet recorded). The signal still ends the
//! process as it would have, with the same exit status.

use std::sync::OnceLock;

/// The note, made before the handlers are installed: a handler may only read it.
static NOTE: OnceLock<Vec<u8>> = OnceLock::new();

const SIGNALS: [libc::c_int; 3] = [libc::SIGINT, libc::SIGTERM, libc::SIGHUP];

/// From here on, a stop signal prints the note naming `rerun` (the command to run again)
/// before it ends the process.
pub fn note_on_signal(rerun: &str) {
    let note = format!(
        "\nshardrun sweep: interrupted. The arrays it submitted stand; `{rerun}` looks up what \
         this one left (an array held or not yet recorded) and submits the rest\n"
    );
    if NOTE.set(note.into_bytes()).is_err() {
        return;
    }
    for signal in SIGNALS {
        // SAFETY: a query, then a handler that only writes a prepared buffer and returns;
        // SA_RESETHAND makes the signal's next delivery (raised in the handler) the default
        // action. A signal ignored from the start (`nohup`'s SIGHUP) stays ignored.
        unsafe {
            let mut old: libc::sigaction = std::mem::zeroed();
            if libc::sigaction(signal, std::ptr::null(), &mut old) != 0
                || old.sa_sigaction == libc::SIG_IGN
            {
                continue;
            }
            let mut action: libc::sigaction = std::mem::zeroed();
            action.sa_sigaction = on_signal as *const () as libc::sighandler_t;
            action.sa_flags = libc::SA_RESETHAND;
            libc::sigemptyset(&mut action.sa_mask);
            libc::sigaction(signal, &action, std::ptr::null_mut());
        }
    }
}

extern "C" fn on_signal(signal: libc::c_int) {
    if let Some(note) = NOTE.get() {
        // SAFETY: write(2) is async-signal-safe; the buffer lives for the whole process.
        unsafe {
            libc::write(libc::STDERR_FILENO, note.as_ptr().cast(), note.len());
        }
    }
    // Delivered once this handler returns, with the default action now: the process ends
    // by the signal, as it would have without the note.
    // SAFETY: raise(3) is async-signal-safe.
    unsafe {
        libc::raise(signal);
    }
}
