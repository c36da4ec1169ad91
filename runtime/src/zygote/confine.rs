//! The last steps before a container's process runs its program: the container's
//! SELinux process label, capabilities, noNewPrivileges and seccomp filter, for its first
//! process and for exec'd ones.
//! libcontainer gets a spec without them: its tenant builder would drop the seccomp profile (an
//! exec'd process would run unfiltered), and it would compile the profile with libseccomp in
//! every process, where the zygote compiles each profile once (`seccomp_filter`). This executor
//! runs in libcontainer's init (the container's or the tenant's) after it has joined the
//! container and switched user (keeping its capabilities, since the spec it was given has
//! none), and applies the three in the order runc and libcontainer use: without
//! noNewPrivileges, loading a filter needs CAP_SYS_ADMIN, so the filter goes first and the
//! capabilities are dropped under it; with noNewPrivileges, the capabilities go first and the
//! filter is loaded last, closest to exec.

use std::collections::HashMap;

use libcontainer::workload::{
    default::get_executor, Executor, ExecutorError, ExecutorSetEnvsError, ExecutorValidationError,
};
use oci_spec::runtime::Spec;

use crate::proto::Confinement;
use crate::seccomp_filter::Filter;

#[derive(Clone)]
pub(crate) struct ConfinedExecutor {
    pub confinement: Confinement,
}

impl ConfinedExecutor {
    fn confine(&self) -> Result<(), String> {
        let c = &self.confinement;
        if let Some(label) = &c.selinux_label {
            crate::selinux::set_exec_label(label).map_err(|e| e.to_string())?;
        }
        if let Some(j) = &c.join_user {
            join_user_namespace(j)?;
        }
        if c.no_new_privileges {
            self.drop_capabilities()?;
            nix::sys::prctl::set_no_new_privs().map_err(|e| format!("setting no_new_privs: {e}"))?;
            self.load_seccomp()
        } else {
            self.load_seccomp()?;
            self.drop_capabilities()
        }
    }

    fn drop_capabilities(&self) -> Result<(), String> {
        let Some(caps) = &self.confinement.capabilities else {
            return Ok(());
        };
        let syscall = libcontainer::syscall::syscall::create_syscall();
        libcontainer::capabilities::drop_privileges(caps, syscall.as_ref())
            .map_err(|e| format!("dropping capabilities: {e}"))
    }

    fn load_seccomp(&self) -> Result<(), String> {
        let c = &self.confinement;
        // (the zygote compiles the profile and keeps only the program; a profile it could not
        // compile fails there, before anything is forked)
        let filter = match (&c.compiled, &c.seccomp) {
            (Some(f), _) => f.clone(),
            (None, Some(profile)) => std::sync::Arc::new(Filter::compile(profile)?),
            (None, None) => return Ok(()),
        };
        filter
            .load()
            .map_err(|e| format!("loading the container's seccomp profile: {e}"))
    }
}

/// Join the container's user namespace (as root inside it: the host's root it still was has
/// no id there), then become the process's user: its groups, gid and uid, as libcontainer
/// switches users outside a user namespace.
fn join_user_namespace(j: &crate::proto::JoinUser) -> Result<(), String> {
    let fd =
        j.fd.ok_or("the user namespace was not opened before the container was entered")?;
    // SAFETY: the worker keeps this fd open until the build returns, and this process (a clone
    // of it) has its own copy; only borrowed here.
    let ns = unsafe { std::os::fd::BorrowedFd::borrow_raw(fd) };
    nix::sched::setns(ns, nix::sched::CloneFlags::CLONE_NEWUSER)
        .map_err(|e| format!("joining the container's user namespace: {e}"))?;
    nix::unistd::setresgid(0.into(), 0.into(), 0.into()).map_err(|e| format!("setresgid(0): {e}"))?;
    nix::unistd::setresuid(0.into(), 0.into(), 0.into()).map_err(|e| format!("setresuid(0): {e}"))?;
    let groups: Vec<nix::unistd::Gid> = j
        .additional_gids
        .iter()
        .map(|g| nix::unistd::Gid::from_raw(*g))
        .collect();
    nix::unistd::setgroups(&groups).map_err(|e| format!("setgroups: {e}"))?;
    // as libcontainer switches the user of any container process (keeping the capabilities
    // for the confinement to set)
    let (uid, gid) = (nix::unistd::Uid::from_raw(j.uid), nix::unistd::Gid::from_raw(j.gid));
    libcontainer::syscall::syscall::create_syscall()
        .set_id(uid, gid)
        .map_err(|e| format!("becoming {uid}:{gid} in the user namespace: {e}"))?;
    Ok(())
}

impl Executor for ConfinedExecutor {
    fn exec(&self, spec: &Spec) -> Result<(), ExecutorError> {
        if let Err(e) = self.confine() {
            // The exec'd process's own stderr (or terminal) by now: the caller sees why it ended
            // instead of an exit status alone.
            use std::io::Write;
            let _ = writeln!(std::io::stderr(), "ferrolet: {e}");
            return Err(ExecutorError::Other(e));
        }
        get_executor().exec(spec)
    }

    fn validate(&self, spec: &Spec) -> Result<(), ExecutorValidationError> {
        get_executor().validate(spec)
    }

    fn setup_envs(&self, envs: HashMap<String, String>) -> Result<(), ExecutorSetEnvsError> {
        get_executor().setup_envs(envs)
    }
}
