//! SELinux labels for containers, as go-selinux gives them to runc and containerd: a process
//! label (the context a container's processes run in, `process.selinuxLabel`) and a mount label
//! (the context of the files it is given: its rootfs, its tmpfs mounts, the volumes relabeled
//! for it, `linux.mountLabel`). The policy's container contexts come from its `lxc_contexts`
//! file; each pod gets a level of its own (`s0:cX,cY`, two categories no other pod holds) unless
//! it names one. Nothing here knows of Kubernetes: the agent says which options a container
//! has. docs/selinux.md

use std::collections::HashSet;
use std::fmt;
use std::io;
use std::path::{Path, PathBuf};

/// The xattr a file's SELinux context lives in.
const XATTR: &str = "security.selinux";

/// What container-selinux's `lxc_contexts` holds on Fedora, RHEL and Debian alike: the contexts
/// used where the policy's own file cannot be read (a policy without one may lack the types,
/// and the kernel then refuses the label, which fails the container with the label named).
pub(crate) const DEFAULT_PROCESS: &str = "system_u:system_r:container_t:s0";
pub(crate) const DEFAULT_FILE: &str = "system_u:object_r:container_file_t:s0";

/// A context `user:role:type:level`; the level may itself hold colons and commas
/// (`s0:c1,c2`, `s0-s0:c0.c1023`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Context {
    pub user: String,
    pub role: String,
    pub type_: String,
    pub level: String,
}

impl Context {
    pub fn parse(s: &str) -> Result<Context, String> {
        let s = s.trim_end_matches(['\n', '\0']);
        let mut parts = s.splitn(4, ':');
        let mut next = |what: &str| {
            parts
                .next()
                .filter(|p| !p.is_empty())
                .map(str::to_string)
                .ok_or_else(|| format!("SELinux context {s:?} has no {what}"))
        };
        Ok(Context {
            user: next("user")?,
            role: next("role")?,
            type_: next("type")?,
            level: next("level")?,
        })
    }
}

impl fmt::Display for Context {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}:{}:{}", self.user, self.role, self.type_, self.level)
    }
}

/// Whether `value` may be the `field` ("user", "role", "type", "level") of a context: names of
/// letters, digits, `_`, `.` and `-`; a level also `:` and `,` (`s0-s0:c0.c1023`). Labels go
/// into mount option strings (`context="..."`): a quote, `=` or blank there would let a pod's
/// options add mount options of their own.
pub fn check_field(field: &str, value: &str) -> Result<(), String> {
    let extra: &[char] = if field == "level" { &[':', ','] } else { &[] };
    let ok = !value.is_empty()
        && value
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-') || extra.contains(&c));
    if ok {
        Ok(())
    } else {
        Err(format!(
            "{field} {value:?} is not an SELinux {field}: letters, digits, '_', '.', '-'{}",
            if field == "level" { ", ':' and ','" } else { "" }
        ))
    }
}

/// [`check_field`] for each field of a whole context (`user:role:type:level`).
pub(crate) fn check_label(label: &str) -> Result<(), String> {
    let c = Context::parse(label)?;
    check_field("user", &c.user)?;
    check_field("role", &c.role)?;
    check_field("type", &c.type_)?;
    check_field("level", &c.level)
}

/// What a container asks for (Kubernetes seLinuxOptions); an empty field keeps the base's.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Options {
    pub user: Option<String>,
    pub role: Option<String>,
    pub type_: Option<String>,
    pub level: Option<String>,
}

impl Options {
    pub fn is_empty(&self) -> bool {
        [&self.user, &self.role, &self.type_, &self.level]
            .iter()
            .all(|f| f.as_deref().is_none_or(str::is_empty))
    }

    /// Every field of `label` (containerd's DupSecOpt: a container without options of its own
    /// takes its sandbox's whole label).
    pub fn of(label: &Context) -> Options {
        Options {
            user: Some(label.user.clone()),
            role: Some(label.role.clone()),
            type_: Some(label.type_.clone()),
            level: Some(label.level.clone()),
        }
    }
}

/// The policy's base contexts for containers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Policy {
    pub process: Context,
    pub file: Context,
    /// Read from the policy's `lxc_contexts` (false: the defaults above).
    pub from_policy: bool,
}

/// A container's two labels.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Labels {
    pub process: Context,
    pub mount: Context,
}

impl Policy {
    /// The contexts of the policy `/etc/selinux/config` names (`SELINUXTYPE`), from its
    /// `contexts/lxc_contexts` (`process = "..."`, `file = "..."`), as go-selinux's
    /// ContainerLabels reads them; the defaults where there is none.
    pub fn load(etc_selinux: &Path) -> Policy {
        let defaults = || Policy {
            process: Context::parse(DEFAULT_PROCESS).expect("a valid context"),
            file: Context::parse(DEFAULT_FILE).expect("a valid context"),
            from_policy: false,
        };
        let Some(name) = std::fs::read_to_string(etc_selinux.join("config"))
            .ok()
            .and_then(|c| config_value(&c, "SELINUXTYPE"))
        else {
            return defaults();
        };
        let Ok(text) = std::fs::read_to_string(etc_selinux.join(name).join("contexts/lxc_contexts")) else {
            return defaults();
        };
        let get = |key| config_value(&text, key).and_then(|v| Context::parse(&v).ok());
        match (get("process"), get("file")) {
            (Some(process), Some(file)) => Policy {
                process,
                file,
                from_policy: true,
            },
            _ => defaults(),
        }
    }

    /// go-selinux's InitLabels: the base contexts with `opts` over them (user and level also
    /// go to the mount label, role and type only to the process's), and `fresh_level` where
    /// no level is asked for.
    pub fn labels(&self, opts: &Options, fresh_level: impl FnOnce() -> String) -> Labels {
        let mut process = self.process.clone();
        let mut mount = self.file.clone();
        let set = |f: &Option<String>| f.as_deref().filter(|v| !v.is_empty()).map(str::to_string);
        if let Some(u) = set(&opts.user) {
            process.user = u.clone();
            mount.user = u;
        }
        if let Some(r) = set(&opts.role) {
            process.role = r;
        }
        if let Some(t) = set(&opts.type_) {
            process.type_ = t;
        }
        let level = set(&opts.level).unwrap_or_else(fresh_level);
        process.level = level.clone();
        mount.level = level;
        Labels { process, mount }
    }
}

/// `KEY = "value"` or `KEY=value` lines, `#` comments.
fn config_value(text: &str, key: &str) -> Option<String> {
    text.lines().find_map(|l| {
        let l = l.trim();
        if l.starts_with('#') {
            return None;
        }
        let (k, v) = l.split_once('=')?;
        (k.trim() == key).then(|| v.trim().trim_matches('"').to_string())
    })
}

/// A level of two categories (`s0:cX,cY`, X < Y < 1024) that `taken` does not hold, as
/// go-selinux's ContainerLabels picks one for each container it labels.
pub fn unique_level(taken: &HashSet<String>) -> String {
    loop {
        let r = u32::from_str_radix(&ferrolet_fsutil::random_hex(4), 16).unwrap_or(0);
        let (a, b) = ((r & 0xffff) % 1024, (r >> 16) % 1024);
        if a == b {
            continue;
        }
        let level = format!("s0:c{},c{}", a.min(b), a.max(b));
        if !taken.contains(&level) {
            return level;
        }
    }
}

/// Whether the kernel enforces or logs SELinux for this process: selinuxfs mounted and the
/// process has a context (go-selinux's GetEnabled).
pub fn enabled() -> bool {
    enabled_at(Path::new("/"))
}

/// [`enabled`], with /sys and /proc under `root`.
pub fn enabled_at(root: &Path) -> bool {
    root.join("sys/fs/selinux/enforce").exists()
        && std::fs::read_to_string(root.join("proc/self/attr/current")).is_ok_and(|c| {
            let c = c.trim_end_matches(['\n', '\0']);
            !c.is_empty() && c != "kernel"
        })
}

/// Label what the next execve of this thread runs as (runc's SetExecLabel).
pub(crate) fn set_exec_label(label: &str) -> io::Result<()> {
    std::fs::write("/proc/thread-self/attr/exec", label)
        .map_err(|e| io::Error::new(e.kind(), format!("setting the SELinux process label {label}: {e}")))
}

/// Label `path` and everything under it `label` (go-selinux's Relabel, private: the
/// container's own level), never following a symlink. Below `path` the walk holds each
/// directory open and names entries through it (`/proc/self/fd/<dir>/<name>`), so a container
/// that swaps a directory of a shared volume for a symlink mid-walk cannot steer it onto the
/// host's files. System directories are refused, as go-selinux refuses them.
pub fn relabel(path: &Path, label: &str) -> io::Result<()> {
    relabel_as(path, XATTR, label)
}

/// [`relabel`], setting the xattr `name` (tests use a trusted.* one: this host has no SELinux).
fn relabel_as(path: &Path, name: &str, label: &str) -> io::Result<()> {
    const REFUSED: &[&str] = &[
        "/", "/bin", "/boot", "/dev", "/etc", "/home", "/lib", "/lib64", "/proc", "/sys", "/usr", "/var",
    ];
    if REFUSED.iter().any(|r| path == Path::new(r)) {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("relabeling {} is not allowed", path.display()),
        ));
    }
    let set = |p: &Path| {
        xattr::set(p, name, label.as_bytes())
            .map_err(|e| io::Error::new(e.kind(), format!("labeling {} {label}: {e}", p.display())))
    };
    set(path)?;
    if !std::fs::symlink_metadata(path)?.is_dir() {
        return Ok(());
    }
    let open_dir = |p: &Path| {
        use std::os::unix::fs::OpenOptionsExt;
        std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_DIRECTORY | libc::O_NOFOLLOW)
            .open(p)
    };
    let mut dirs = vec![open_dir(path)?];
    while let Some(dir) = dirs.pop() {
        use std::os::fd::AsRawFd;
        let at = PathBuf::from(format!("/proc/self/fd/{}", dir.as_raw_fd()));
        for e in std::fs::read_dir(&at)? {
            let e = e?;
            let entry = at.join(e.file_name());
            match set(&entry) {
                Ok(()) => {}
                // gone meanwhile (the container removed it)
                Err(err) if err.kind() == io::ErrorKind::NotFound => continue,
                Err(err) => return Err(err),
            }
            if e.file_type()?.is_dir() {
                match open_dir(&entry) {
                    Ok(d) => dirs.push(d),
                    // removed, or swapped for a symlink or a file since it was listed: not ours to follow
                    Err(err) if matches!(err.raw_os_error(), Some(libc::ENOENT | libc::ELOOP | libc::ENOTDIR)) => {}
                    Err(err) => return Err(err),
                }
            }
        }
    }
    Ok(())
}

/// The label of `path` itself (not following a symlink).
pub fn file_label(path: &Path) -> io::Result<Option<String>> {
    Ok(xattr::get(path, XATTR)?.map(|v| String::from_utf8_lossy(&v).trim_end_matches('\0').to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn contexts_parse_with_levels_of_their_own_colons() {
        let c = Context::parse("system_u:system_r:container_t:s0:c1,c2\n").unwrap();
        assert_eq!(c.type_, "container_t");
        assert_eq!(c.level, "s0:c1,c2");
        assert_eq!(c.to_string(), "system_u:system_r:container_t:s0:c1,c2");
        assert!(Context::parse("system_u:system_r").is_err());
        assert!(Context::parse("u:r::s0").is_err());
    }

    #[test]
    fn the_policys_lxc_contexts_are_the_base_and_defaults_stand_in() {
        let d = tempfile::tempdir().unwrap();
        assert_eq!(Policy::load(d.path()).process.to_string(), DEFAULT_PROCESS);
        assert!(!Policy::load(d.path()).from_policy);
        std::fs::write(d.path().join("config"), "# x\nSELINUX=permissive\nSELINUXTYPE=tgt\n").unwrap();
        std::fs::create_dir_all(d.path().join("tgt/contexts")).unwrap();
        std::fs::write(
            d.path().join("tgt/contexts/lxc_contexts"),
            "process = \"system_u:system_r:ctr_t:s0\"\nfile = \"system_u:object_r:ctr_file_t:s0\"\nro_file=\"x:y:z:s0\"\n",
        )
        .unwrap();
        let p = Policy::load(d.path());
        assert!(p.from_policy);
        assert_eq!(p.process.type_, "ctr_t");
        assert_eq!(p.file.type_, "ctr_file_t");
    }

    #[test]
    fn options_go_over_the_base_as_go_selinux_puts_them() {
        let p = Policy::load(Path::new("/nonexistent"));
        let l = p.labels(
            &Options {
                user: Some("u2".into()),
                role: Some("r2".into()),
                type_: Some("t2".into()),
                level: Some("s0:c5,c6".into()),
            },
            || unreachable!(),
        );
        assert_eq!(l.process.to_string(), "u2:r2:t2:s0:c5,c6");
        assert_eq!(l.mount.to_string(), "u2:object_r:container_file_t:s0:c5,c6");
        let l = p.labels(&Options::default(), || "s0:c1,c9".into());
        assert_eq!(l.process.to_string(), "system_u:system_r:container_t:s0:c1,c9");
        assert_eq!(l.mount.to_string(), "system_u:object_r:container_file_t:s0:c1,c9");
        // empty strings are unset fields, as the API server keeps them
        let l = p.labels(
            &Options {
                level: Some(String::new()),
                type_: Some("spc_t".into()),
                ..Default::default()
            },
            || "s0:c3,c4".into(),
        );
        assert_eq!(l.process.to_string(), "system_u:system_r:spc_t:s0:c3,c4");
    }

    #[test]
    fn fresh_levels_are_two_categories_nobody_holds() {
        let mut taken = HashSet::new();
        for _ in 0..2000 {
            let l = unique_level(&taken);
            let cats: Vec<u16> = l
                .strip_prefix("s0:c")
                .unwrap()
                .split(",c")
                .map(|c| c.parse().unwrap())
                .collect();
            assert!(cats.len() == 2 && cats[0] < cats[1] && cats[1] < 1024, "{l}");
            assert!(taken.insert(l));
        }
    }

    #[test]
    fn fields_that_could_add_mount_options_are_refused() {
        assert!(check_label("system_u:system_r:container_t:s0:c1,c2").is_ok());
        assert!(check_label("system_u:system_r:kernel_t:s0-s0:c0.c1023").is_ok());
        assert!(check_field("level", "s0\",upperdir=/etc").is_err());
        assert!(check_field("type", "spc_t,ro").is_err());
        assert!(check_field("user", "a b").is_err());
        assert!(check_label("u:r:t:s0\"").is_err());
        assert_eq!(
            check_field("level", "s0=1").unwrap_err(),
            "level \"s0=1\" is not an SELinux level: letters, digits, '_', '.', '-', ':' and ','"
        );
    }

    #[test]
    fn a_symlink_in_the_tree_is_labeled_itself_never_its_target() {
        // user.* stands in for security.selinux (this host has no SELinux); the walk is the same
        let d = tempfile::tempdir().unwrap();
        let (tree, outside) = (d.path().join("tree"), d.path().join("outside"));
        std::fs::create_dir_all(tree.join("sub")).unwrap();
        std::fs::create_dir_all(&outside).unwrap();
        std::fs::write(tree.join("sub/f"), "x").unwrap();
        std::fs::write(outside.join("secret"), "x").unwrap();
        std::os::unix::fs::symlink(&outside, tree.join("escape")).unwrap();
        relabel_as(&tree, "trusted.ferrolet-test", "l").unwrap();
        let get = |p: &Path| xattr::get(p, "trusted.ferrolet-test").unwrap();
        assert_eq!(get(&tree.join("sub/f")).as_deref(), Some(&b"l"[..]));
        assert_eq!(get(&tree.join("sub")).as_deref(), Some(&b"l"[..]));
        assert!(
            get(&outside.join("secret")).is_none(),
            "the symlink's target is the host's"
        );
        assert!(get(&outside).is_none());
    }

    #[test]
    fn system_directories_are_never_relabeled() {
        assert!(relabel(Path::new("/etc"), "a:b:c:s0").is_err());
        assert!(relabel(Path::new("/"), "a:b:c:s0").is_err());
    }
}
