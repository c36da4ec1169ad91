//! `ferrolet logs POD [-c NAME] [-f] [--previous] [--tail N] [--timestamps]`.

use std::io::Write;

use anyhow::Result;

use super::LogsArgs;

pub async fn run(args: &LogsArgs) -> Result<i32> {
    let socket = args.root.root_dir.join("ferrolet.sock");
    let mut q = vec![
        format!("follow={}", args.follow),
        format!("previous={}", args.previous),
        format!("timestamps={}", args.timestamps),
    ];
    if args.tail >= 0 {
        q.push(format!("tailLines={}", args.tail));
    }
    if let Some(c) = &args.container {
        q.push(format!("container={}", enc(c)));
    }
    let path = format!(
        "/ferrolet/logs/{}/{}?{}",
        enc(&args.namespace),
        enc(&args.pod),
        q.join("&")
    );
    let mut out = std::io::stdout();
    super::client::get(&socket, &path, |chunk| {
        out.write_all(chunk)?;
        out.flush()?;
        Ok(())
    })
    .await?;
    Ok(0)
}

fn enc(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'a'..=b'z' | b'A'..=b'Z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect()
}
