//! Where a container's create+start+wait+delete spends its time, per phase (p50 of N runs).
//! Run as root: `cargo run --release -p ferrolet-runtime --example floor -- IMAGE_TAR [N]`.

use std::time::Instant;

use ferrolet_runtime::cgroups::{Cgroups, NestedRoot};
use ferrolet_runtime::{fork_zygote, ContainerConfig, Runtime};

fn main() {
    let zygote = fork_zygote().expect("zygote");
    let args: Vec<String> = std::env::args().collect();
    let image = args.get(1).expect("usage: floor IMAGE_TAR [N]");
    let n: usize = args.get(2).and_then(|s| s.parse().ok()).unwrap_or(30);
    let root = std::env::temp_dir().join(format!("ferrolet-floor-{}", std::process::id()));
    let rt = Runtime::new(&root, zygote).expect("runtime");
    rt.images().import(std::path::Path::new(image)).expect("import");
    let cg = NestedRoot::create(
        &Cgroups::detect().unwrap(),
        &format!("ferrolet-floor-{}", std::process::id()),
    )
    .unwrap();
    let cfg = ContainerConfig {
        name: "floor".into(),
        image: "busybox:1.35".into(),
        command: vec!["true".into()],
        cgroup_parent: cg.path().to_string(),
        ..Default::default()
    };
    let tokio = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let mut phases: [Vec<f64>; 5] = Default::default();
    for _ in 0..n {
        tokio.block_on(async {
            let t = Instant::now();
            let c = rt.create(&cfg).await.unwrap();
            let t1 = t.elapsed();
            rt.start(c.id()).await.unwrap();
            let t2 = t.elapsed();
            rt.wait(c.id()).await.unwrap();
            let t3 = t.elapsed();
            rt.delete(c.id()).await.unwrap();
            let t4 = t.elapsed();
            let ms = |d: std::time::Duration| d.as_secs_f64() * 1000.0;
            phases[0].push(ms(t1));
            phases[1].push(ms(t2 - t1));
            phases[2].push(ms(t3 - t2));
            phases[3].push(ms(t4 - t3));
            phases[4].push(ms(t4));
        });
    }
    for (name, mut v) in ["create", "start", "wait", "delete", "total"].into_iter().zip(phases) {
        v.sort_by(|a, b| a.partial_cmp(b).unwrap());
        println!("{name:>7}: p50 {:6.2} ms   min {:6.2} ms", v[v.len() / 2], v[0]);
    }
    let _ = cg.cleanup();
    let _ = std::fs::remove_dir_all(&root);
}
