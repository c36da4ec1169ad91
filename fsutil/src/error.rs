//! The error of a file, JSON or system-call operation, the trait that attaches "what were we
//! doing" to one, and [`chain`], which prints an error with its causes.

use std::fmt;

/// A failed file, JSON or system-call operation. `Display` is the context only (what was being
/// done, to what); the cause is [`source`](std::error::Error::source). Print both with
/// [`chain`].
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("{context}")]
    Io {
        context: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{context}")]
    Json {
        context: String,
        #[source]
        source: serde_json::Error,
    },
    #[error("{context}")]
    Sys {
        context: String,
        #[source]
        source: nix::Error,
    },
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    pub fn io(context: impl Into<String>, source: std::io::Error) -> Self {
        Error::Io {
            context: context.into(),
            source,
        }
    }

    pub fn json(context: impl Into<String>, source: serde_json::Error) -> Self {
        Error::Json {
            context: context.into(),
            source,
        }
    }

    pub fn sys(context: impl Into<String>, source: nix::Error) -> Self {
        Error::Sys {
            context: context.into(),
            source,
        }
    }

    /// What was being done (the `Display` text).
    pub fn context(&self) -> &str {
        match self {
            Error::Io { context, .. } | Error::Json { context, .. } | Error::Sys { context, .. } => context,
        }
    }

    /// The errno behind an io or system-call error, if any.
    pub fn errno(&self) -> Option<i32> {
        match self {
            Error::Io { source, .. } => source.raw_os_error(),
            Error::Sys { source, .. } => Some(*source as i32),
            Error::Json { .. } => None,
        }
    }

    /// True when a path was refused because it leads outside the directory it had to stay
    /// beneath ([`RootDir`](crate::RootDir): `..` or a symlink climbing out, `EXDEV`).
    pub fn is_escape(&self) -> bool {
        self.errno() == Some(libc::EXDEV)
    }

    /// True when the error is "the file is not there" (ENOENT) rather than a real failure.
    pub fn is_not_found(&self) -> bool {
        match self {
            Error::Io { source, .. } => source.kind() == std::io::ErrorKind::NotFound,
            Error::Sys { source, .. } => *source == nix::Error::ENOENT,
            Error::Json { .. } => false,
        }
    }
}

/// Attach "what were we doing" to io, serde_json and nix errors, making an [`Error`].
pub trait Context<T> {
    fn context<C: Into<String>>(self, context: C) -> Result<T>;
    fn with_context<C: Into<String>, F: FnOnce() -> C>(self, f: F) -> Result<T>;
}

macro_rules! impl_context {
    ($err:ty, $make:path) => {
        impl<T> Context<T> for std::result::Result<T, $err> {
            fn context<C: Into<String>>(self, context: C) -> Result<T> {
                self.map_err(|e| $make(context, e))
            }
            fn with_context<C: Into<String>, F: FnOnce() -> C>(self, f: F) -> Result<T> {
                self.map_err(|e| $make(f(), e))
            }
        }
    };
}

impl_context!(std::io::Error, Error::io);
impl_context!(serde_json::Error, Error::json);
impl_context!(nix::Error, Error::sys);

/// An error and its causes on one line, each once: `context: cause: cause`. Use it wherever
/// an error is rendered for a person (a log field, a reply, a status message):
/// `format!("{}", chain(&e))`, `tracing::warn!(error = %chain(&e), ...)`.
///
/// A cause whose text the line already ends with is skipped, so an error of another crate
/// that prints its source in its own `Display` does not show it twice.
pub fn chain<'a>(err: &'a (dyn std::error::Error + 'a)) -> Chain<'a> {
    Chain(err)
}

/// The `Display` adapter returned by [`chain`].
#[derive(Clone, Copy)]
pub struct Chain<'a>(&'a (dyn std::error::Error + 'a));

impl fmt::Display for Chain<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut line = self.0.to_string();
        let mut cur = self.0.source();
        while let Some(cause) = cur {
            let text = cause.to_string();
            if !text.is_empty() && !line.ends_with(&text) {
                if !line.is_empty() {
                    line.push_str(": ");
                }
                line.push_str(&text);
            }
            cur = cause.source();
        }
        f.write_str(&line)
    }
}

impl fmt::Debug for Chain<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::error::Error as _;

    fn not_found() -> Error {
        let r: std::io::Result<()> = Err(std::io::Error::from_raw_os_error(libc::ENOENT));
        r.context("reading /x/state.json").unwrap_err()
    }

    #[test]
    fn display_is_the_context_and_source_the_cause() {
        let e = not_found();
        assert_eq!(e.to_string(), "reading /x/state.json");
        assert_eq!(e.context(), "reading /x/state.json");
        let cause = e.source().expect("a cause");
        assert!(cause.to_string().contains("No such file"), "{cause}");
        assert!(e.is_not_found());
        assert_eq!(e.errno(), Some(libc::ENOENT));
    }

    #[test]
    fn chain_prints_each_cause_once() {
        let e = not_found();
        assert_eq!(
            chain(&e).to_string(),
            "reading /x/state.json: No such file or directory (os error 2)"
        );

        // An error that also prints its source in Display: the cause is not repeated.
        #[derive(Debug, thiserror::Error)]
        #[error("outer: {0}")]
        struct Loud(#[source] Error);
        let loud = Loud(not_found());
        assert_eq!(
            chain(&loud).to_string(),
            "outer: reading /x/state.json: No such file or directory (os error 2)"
        );

        // A transparent wrapper shows the chain of what it wraps.
        #[derive(Debug, thiserror::Error)]
        enum Wrapper {
            #[error(transparent)]
            Fs(#[from] Error),
        }
        let w = Wrapper::from(not_found());
        assert_eq!(w.to_string(), "reading /x/state.json");
        assert_eq!(chain(&w).to_string(), chain(&not_found()).to_string());
    }

    #[test]
    fn nix_and_json_errors() {
        let r: nix::Result<()> = Err(nix::Error::EPERM);
        let e = r.with_context(|| "mounting /x").unwrap_err();
        assert_eq!(e.to_string(), "mounting /x");
        assert_eq!(e.errno(), Some(libc::EPERM));
        assert!(!e.is_not_found());
        assert!(chain(&e).to_string().starts_with("mounting /x: EPERM"), "{}", chain(&e));

        let r: serde_json::Result<u32> = serde_json::from_str("nope");
        let e = r.context("decoding /x").unwrap_err();
        assert!(matches!(e, Error::Json { .. }));
        assert_eq!(e.errno(), None);
        assert!(
            chain(&e).to_string().starts_with("decoding /x: expected"),
            "{}",
            chain(&e)
        );
    }
}
