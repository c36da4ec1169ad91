//! kubelet's failSwapOn: the node agent refuses to start while the node has swap on, with
//! kubelet's message, unless told otherwise (`failSwapOn: false`, `--fail-swap-on=false`).

use std::path::Path;

use anyhow::{bail, Context, Result};

/// The swap areas listed in `swaps` (the format of /proc/swaps: a header line, then one line
/// per area).
pub fn swap_areas(swaps: &Path) -> Result<Vec<String>> {
    let text = std::fs::read_to_string(swaps).with_context(|| format!("reading {}", swaps.display()))?;
    Ok(text
        .lines()
        .skip(1)
        .filter(|l| !l.trim().is_empty())
        .map(str::to_string)
        .collect())
}

/// kubelet's check in NewContainerManager: with failSwapOn, any swap area is an error.
pub fn check(fail_swap_on: bool, swaps: &Path) -> Result<()> {
    if !fail_swap_on {
        return Ok(());
    }
    let areas = swap_areas(swaps)?;
    if !areas.is_empty() {
        bail!(
            "running with swap on is not supported, please disable swap! or set --fail-swap-on flag to false. {} contained: {areas:?}",
            swaps.display()
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn swap_on_refuses_unless_told_otherwise() {
        let d = tempfile::tempdir().unwrap();
        let f = d.path().join("swaps");
        std::fs::write(&f, "Filename\t\t\t\tType\t\tSize\t\tUsed\t\tPriority\n").unwrap();
        assert!(check(true, &f).is_ok());
        std::fs::write(
            &f,
            "Filename\t\t\t\tType\t\tSize\t\tUsed\t\tPriority\n/swapfile                               file\t\t102396\t\t0\t\t-2\n",
        )
        .unwrap();
        let e = check(true, &f).unwrap_err().to_string();
        assert!(
            e.starts_with(
                "running with swap on is not supported, please disable swap! or set --fail-swap-on flag to false."
            ) && e.contains("/swapfile"),
            "{e}"
        );
        assert!(check(false, &f).is_ok());
    }
}
