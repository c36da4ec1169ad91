//! How the agent renders errors from the libraries: each cause once, outermost first
//! ("creating x: permission denied"), the way anyhow's `{:#}` renders its own.

/// `e` and its sources joined with ": ".
pub fn chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut s = e.to_string();
    let mut cur = e.source();
    while let Some(c) = cur {
        let part = c.to_string();
        if !s.ends_with(&part) {
            s.push_str(": ");
            s.push_str(&part);
        }
        cur = c.source();
    }
    s
}
