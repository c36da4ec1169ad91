//! The last steps before an exec'd process runs its program: the container's capabilities,
//! noNewPrivileges and seccomp filter. libcontainer's tenant builder keeps the container's
//! namespaces and cgroup but rebuilds the spec's `linux` without `seccomp`, so an exec'd
//! process would run unfiltered; libcontainer's own init applies the rest. This executor runs in
//! the tenant's init after it has joined the container and switched user (keeping its
//! capabilities, since the process.json has none), and applies the three in the order runc uses:
//! without noNewPrivileges, loading a filter needs CAP_SYS_ADMIN, so the filter goes first and
//! the capabilities are dropped under it (as for the container's own first process); with
//! noNewPrivileges, the capabilities go first and the filter is loaded last, closest to exec.

use std::collections::HashMap;

use libcontainer::workload::{
    default::get_executor, Executor, ExecutorError, ExecutorSetEnvsError, ExecutorValidationError,
};
use oci_spec::runtime::Spec;

use crate::proto::Confinement;

#[derive(Clone)]
pub(crate) struct ConfinedExecutor {
    pub confinement: Confinement,
}

impl ConfinedExecutor {
    fn confine(&self) -> Result<(), String> {
        let c = &self.confinement;
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
        let Some(profile) = &self.confinement.seccomp else {
            return Ok(());
        };
        match libcontainer::seccomp::initialize_seccomp(profile) {
            // A notify action needs a listener, which ferrolet never configures (the container
            // could not have been created with one either): refuse rather than hang its calls.
            Ok(Some(fd)) => {
                let _ = nix::unistd::close(fd);
                Err("the seccomp profile asks for a notify listener, which ferrolet does not run".into())
            }
            Ok(None) => Ok(()),
            Err(e) => Err(format!("loading the container's seccomp profile: {e}")),
        }
    }
}

impl Executor for ConfinedExecutor {
    fn exec(&self, spec: &Spec) -> Result<(), ExecutorError> {
        if let Err(e) = self.confine() {
            // The exec'd process's own stderr (or terminal) by now: the caller sees why it ended
            // instead of an exit status alone.
            use std::io::Write;
            let _ = writeln!(std::io::stderr(), "ferrolet: exec: {e}");
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
