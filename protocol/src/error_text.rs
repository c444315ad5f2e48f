//! Errors as people read them, on both sides: the message, then each cause that does not
//! repeat what was already said (a `thiserror` message often includes its source, which the
//! error also reports as its cause).

use std::error::Error;

/// `causes` (an error, then its sources in order) joined by ": ", leaving out a cause whose
/// text the line already holds.
pub fn join_causes<'a>(causes: impl IntoIterator<Item = &'a (dyn Error + 'static)>) -> String {
    let mut text = String::new();
    for cause in causes {
        let said = cause.to_string();
        if text.contains(&said) {
            continue;
        }
        if !text.is_empty() {
            text.push_str(": ");
        }
        text.push_str(&said);
    }
    text
}

/// An error and its sources, outermost first.
pub fn chain<'a>(
    err: &'a (dyn Error + 'static),
) -> impl Iterator<Item = &'a (dyn Error + 'static)> {
    std::iter::successors(Some(err), |&e| e.source())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, thiserror::Error)]
    #[error("lost the connection to {addr}: {source}")]
    struct Lost {
        addr: String,
        source: std::io::Error,
    }

    #[derive(Debug, thiserror::Error)]
    #[error("the rendezvous failed")]
    struct Rendezvous(#[source] Lost);

    #[test]
    fn a_source_the_message_already_quotes_is_said_once() {
        let err = Rendezvous(Lost {
            addr: "node1:5000".into(),
            source: std::io::Error::other("the peer closed the connection"),
        });
        assert_eq!(
            join_causes(chain(&err)),
            "the rendezvous failed: lost the connection to node1:5000: the peer closed the \
             connection"
        );
    }
}
