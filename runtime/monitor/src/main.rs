//! The monitor program (docs/runtime.md#the-monitor-image): the runtime executes it in a
//! container's monitor once the container is built, with the descriptors to watch described in
//! the environment ([`ferrolet_monitor::handoff`]). Not for running by hand.

use ferrolet_monitor::handoff;

fn main() {
    if let Ok(name) = std::ffi::CString::new(handoff::COMM) {
        let _ = nix::sys::prctl::set_name(&name);
    }
    // The forked monitor was a subreaper already, and execve keeps it; said again, so that
    // orphans of a container in a shared pid namespace come here whatever the kernel.
    let _ = nix::sys::prctl::set_child_subreaper(true);
    let code = match handoff::receive() {
        Ok(mut received) => {
            // Named and a subreaper above: now the runtime may know this monitor.
            received.answer();
            let code = received.watch.run();
            drop(received.state_dir);
            code
        }
        // stdout and stderr are /dev/null: the runtime sees a monitor that left no exit record.
        Err(_) => 2,
    };
    std::process::exit(code)
}
