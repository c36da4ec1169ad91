//! `ferrolet images import|ls|rm`, straight on the image store under the root dir (the agent
//! need not run; it sees the changes at once).

use anyhow::Result;
use ferrolet_runtime::image::{ImageStore, Reference};

use super::ImagesCommand;

fn human(bytes: u64) -> String {
    let units = ["B", "kB", "MB", "GB", "TB"];
    let mut v = bytes as f64;
    let mut u = 0;
    while v >= 1000.0 && u < units.len() - 1 {
        v /= 1000.0;
        u += 1;
    }
    if u == 0 {
        format!("{bytes}B")
    } else {
        format!("{v:.3}{}", units[u]).replace(".000", "")
    }
}

pub fn run(cmd: &ImagesCommand) -> Result<i32> {
    match cmd {
        ImagesCommand::Import { root, files } => {
            let store = ImageStore::open(root.root_dir.join("images"))?;
            let mut failed = 0;
            for f in files {
                match store.import(f) {
                    Ok(imgs) => {
                        for i in imgs {
                            let names = if i.refs.is_empty() {
                                "<none>".to_string()
                            } else {
                                i.refs.join(", ")
                            };
                            println!("imported {names} ({})", i.id);
                        }
                    }
                    Err(e) => {
                        eprintln!("{}: {e}", f.display());
                        failed += 1;
                    }
                }
            }
            Ok(if failed > 0 { 1 } else { 0 })
        }
        ImagesCommand::Ls { root } => {
            let store = ImageStore::open(root.root_dir.join("images"))?;
            println!("{:<50} {:<15} {:<14} SIZE", "IMAGE", "TAG", "IMAGE ID");
            for i in store.list()? {
                let names: Vec<(String, String)> = if i.refs.is_empty() {
                    vec![("<none>".into(), "<none>".into())]
                } else {
                    i.refs
                        .iter()
                        .map(|r| {
                            let p = Reference::parse(r).ok();
                            (
                                p.as_ref().map(|p| p.repository.clone()).unwrap_or_else(|| r.clone()),
                                p.and_then(|p| p.tag).unwrap_or_else(|| "<none>".into()),
                            )
                        })
                        .collect()
                };
                for (repo, tag) in names {
                    println!("{:<50} {:<15} {:<14} {}", repo, tag, i.id.short(), human(i.size));
                }
            }
            Ok(0)
        }
        ImagesCommand::Rm { root, refs } => {
            let store = ImageStore::open(root.root_dir.join("images"))?;
            let users = super::reset::image_users(&root.root_dir);
            // A container whose record was rebuilt from what survived may use any image.
            let unknown = ferrolet_runtime::digest::Digest::of(b"");
            if let Some((id, _)) = users.iter().find(|(_, d)| *d == unknown) {
                eprintln!(
                    "container {id} uses an image that is not known (its record was rebuilt); remove the container (or `ferrolet reset`) before removing images"
                );
                return Ok(1);
            }
            let mut failed = 0;
            for r in refs {
                match store.remove(r, &users) {
                    Ok(lines) => lines.iter().for_each(|l| println!("{l}")),
                    Err(e) => {
                        eprintln!("{r}: {e}");
                        failed += 1;
                    }
                }
            }
            Ok(if failed > 0 { 1 } else { 0 })
        }
    }
}
