//! A container's termination message as kubelet reads it (kuberuntime's
//! getTerminationMessage): the file behind terminationMessagePath, or with
//! `terminationMessagePolicy: FallbackToLogsOnError` and a failed container, the end of its log.

use super::views::ContainerView;

/// The terminated state's message: the termination message file, or with
/// FallbackToLogsOnError and a failure, the end of the log (80 lines, at most 2048 bytes).
pub fn termination_message(v: &ContainerView) -> String {
    const MAX: usize = 4096;
    let from_file = v
        .termination_message_file
        .as_ref()
        .and_then(|f| std::fs::read(f).ok())
        .map(|d| String::from_utf8_lossy(&d[d.len().saturating_sub(MAX)..]).into_owned())
        .unwrap_or_default();
    let failed = v.exit().is_some_and(|e| e.exit_code != 0);
    if from_file.is_empty() && failed && v.termination_message_policy == "FallbackToLogsOnError" {
        return log_tail(&v.log_path, 80, 2048);
    }
    from_file
}

/// The last `lines` lines of a container's log, at most `max` bytes, as kubelet's
/// FallbackToLogsOnError reads them.
pub fn log_tail(path: &std::path::Path, lines: usize, max: usize) -> String {
    let Ok(data) = std::fs::read(path) else {
        return String::new();
    };
    let recs = ferrolet_runtime::crilog::read_records(&data);
    let start = recs.len().saturating_sub(lines);
    let mut out = String::new();
    for r in &recs[start..] {
        out.push_str(&String::from_utf8_lossy(&r.message));
        // A partial last line (the container wrote no newline) stays as written: kubelet's
        // log reader adds a newline only after full (`F`) records.
        if !r.partial {
            out.push('\n');
        }
    }
    if out.len() > max {
        let cut = out.len() - max;
        let mut i = cut;
        while !out.is_char_boundary(i) {
            i += 1;
        }
        out = out[i..].to_string();
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn log(lines: &[&str]) -> (tempfile::TempDir, std::path::PathBuf) {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("0.log");
        let mut s = String::new();
        for l in lines {
            s.push_str(l);
            s.push('\n');
        }
        std::fs::write(&p, s).unwrap();
        (d, p)
    }

    #[test]
    fn a_partial_last_line_gains_no_newline() {
        let (_d, p) = log(&["2024-01-01T00:00:00Z stdout P DONE"]);
        assert_eq!(log_tail(&p, 80, 2048), "DONE");
        let (_d, p) = log(&[
            "2024-01-01T00:00:00Z stdout F first",
            "2024-01-01T00:00:01Z stdout P DO",
            "2024-01-01T00:00:02Z stdout P NE",
        ]);
        assert_eq!(log_tail(&p, 80, 2048), "first\nDONE");
    }

    #[test]
    fn full_lines_keep_their_newlines_and_the_tail_is_bounded() {
        let (_d, p) = log(&["2024-01-01T00:00:00Z stdout F DONE"]);
        assert_eq!(log_tail(&p, 80, 2048), "DONE\n");
        let many: Vec<String> = (0..100)
            .map(|i| format!("2024-01-01T00:00:00Z stderr F l{i}"))
            .collect();
        let refs: Vec<&str> = many.iter().map(String::as_str).collect();
        let (_d, p) = log(&refs);
        let t = log_tail(&p, 80, 2048);
        assert!(t.starts_with("l20\n") && t.ends_with("l99\n"), "{t}");
        assert_eq!(log_tail(&p, 80, 8), "l98\nl99\n");
    }
}
