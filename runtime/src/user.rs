//! Resolving a container's user from the image: `User` may be `name`, `uid`, `name:group` or
//! `uid:gid`, and names are looked up in the image's own /etc/passwd and /etc/group (read from
//! the unpacked layers, top layer first, never from the node).

use std::fs;
use std::path::{Path, PathBuf};

use crate::error::{Error, Result};

#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ResolvedUser {
    pub uid: u32,
    pub gid: u32,
    pub additional_gids: Vec<u32>,
    /// The passwd name, when the uid has one (for HOME and group membership).
    pub name: Option<String>,
    pub home: Option<String>,
}

#[derive(Debug, Clone)]
struct PasswdEntry {
    name: String,
    uid: u32,
    gid: u32,
    home: String,
}

#[derive(Debug, Clone)]
struct GroupEntry {
    name: String,
    gid: u32,
    members: Vec<String>,
}

/// Reads files of the image as the container will see them, from layer directories: the
/// union of the layers as overlayfs presents it (the topmost layer that has an entry decides,
/// directories merge unless opaque, whiteouts hide), every symlink resolved by this code inside
/// the image, never by the kernel on the node (an image's `/etc -> /host/dir` must not make the
/// node's files the container's), with a hop limit, and at most [`MAX_FILE`] bytes read.
pub(crate) struct ImageFiles {
    /// Top layer first.
    layers: Vec<PathBuf>,
}

/// The most bytes read of an image file (its /etc/passwd, /etc/group): larger ones are refused.
pub(crate) const MAX_FILE: u64 = 4 << 20;
/// Symlinks followed in one lookup, as the kernel's MAXSYMLINKS.
const MAX_HOPS: usize = 40;

/// What the union has at a path.
enum Entry {
    Dir,
    File(PathBuf),
    Symlink(PathBuf),
}

impl ImageFiles {
    /// `layers` bottom first, as the image lists them.
    pub(crate) fn new(layers: &[PathBuf]) -> Self {
        ImageFiles {
            layers: layers.iter().rev().cloned().collect(),
        }
    }

    /// The content of the regular file at `path` (absolute in the image). `Ok(None)` when the
    /// image has no such file; an error for a file it cannot read as the container would (a
    /// symlink loop, a file over [`MAX_FILE`]).
    pub(crate) fn read(&self, path: &str) -> std::result::Result<Option<String>, String> {
        let Some(file) = self.lookup(path)? else {
            return Ok(None);
        };
        use std::io::Read;
        use std::os::unix::fs::OpenOptionsExt;
        let f = fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
            .open(&file)
            .map_err(|e| format!("{path}: {e}"))?;
        let md = f.metadata().map_err(|e| format!("{path}: {e}"))?;
        if !md.is_file() {
            return Ok(None);
        }
        if md.len() > MAX_FILE {
            return Err(format!(
                "{path} is {} bytes, more than the {MAX_FILE} read of it",
                md.len()
            ));
        }
        let mut data = Vec::with_capacity(md.len() as usize);
        f.take(MAX_FILE + 1)
            .read_to_end(&mut data)
            .map_err(|e| format!("{path}: {e}"))?;
        if data.len() as u64 > MAX_FILE {
            return Err(format!("{path} is more than the {MAX_FILE} bytes read of it"));
        }
        Ok(Some(String::from_utf8_lossy(&data).into_owned()))
    }

    /// Where the file at `path` lies in a layer directory, resolved component by component.
    fn lookup(&self, path: &str) -> std::result::Result<Option<PathBuf>, String> {
        let mut pending: std::collections::VecDeque<String> = components(path).collect();
        let mut at: Vec<String> = Vec::new();
        let mut hops = 0;
        while let Some(c) = pending.pop_front() {
            if c == ".." {
                at.pop();
                continue;
            }
            at.push(c);
            match self.entry(&at).map_err(|e| format!("{path}: {e}"))? {
                None => return Ok(None),
                Some(Entry::Dir) => {
                    if pending.is_empty() {
                        return Ok(None);
                    }
                }
                Some(Entry::File(p)) => return Ok(pending.is_empty().then_some(p)),
                Some(Entry::Symlink(target)) => {
                    hops += 1;
                    if hops > MAX_HOPS {
                        return Err(format!("{path}: too many levels of symbolic links"));
                    }
                    at.pop();
                    if target.is_absolute() {
                        at.clear();
                    }
                    let t = target.to_string_lossy().into_owned();
                    for (i, c) in components(&t).enumerate() {
                        pending.insert(i, c);
                    }
                }
            }
        }
        Ok(None)
    }

    /// The union's entry at `at` (components from the image's root; every prefix a directory
    /// of the union): the topmost layer with an entry there decides; a lower layer counts only
    /// while every layer above it has directories on the way, none of them opaque.
    fn entry(&self, at: &[String]) -> std::io::Result<Option<Entry>> {
        for layer in &self.layers {
            match layer_entry(layer, at)? {
                InLayer::Found(e) => return Ok(Some(e)),
                InLayer::Hides => return Ok(None),
                InLayer::Absent { opaque: true } => return Ok(None),
                InLayer::Absent { opaque: false } => {}
            }
        }
        Ok(None)
    }
}

/// What one layer has at a path.
enum InLayer {
    Found(Entry),
    /// A whiteout, or something other than a directory on the way: nothing below shows.
    Hides,
    /// Nothing there; `opaque`: a directory on the way hides the layers below.
    Absent {
        opaque: bool,
    },
}

/// One layer's entry at `at`, every component checked in turn (`lstat`), so that nothing on the
/// way is a symlink the kernel would follow on the node.
fn layer_entry(layer: &Path, at: &[String]) -> std::io::Result<InLayer> {
    use std::os::unix::fs::{FileTypeExt, MetadataExt};
    let mut p = layer.to_path_buf();
    let mut opaque_dir = false;
    for (i, c) in at.iter().enumerate() {
        p.push(c);
        let md = match fs::symlink_metadata(&p) {
            Ok(m) => m,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(InLayer::Absent { opaque: opaque_dir }),
            Err(e) => return Err(e),
        };
        let ft = md.file_type();
        let whiteout = ft.is_char_device() && md.rdev() == 0;
        if i + 1 < at.len() {
            if whiteout || !ft.is_dir() {
                return Ok(InLayer::Hides);
            }
            opaque_dir |= opaque(&p);
            continue;
        }
        return Ok(if whiteout {
            InLayer::Hides
        } else if ft.is_dir() {
            InLayer::Found(Entry::Dir)
        } else if ft.is_symlink() {
            InLayer::Found(Entry::Symlink(fs::read_link(&p)?))
        } else if ft.is_file() {
            InLayer::Found(Entry::File(p))
        } else {
            InLayer::Hides
        });
    }
    Ok(InLayer::Found(Entry::Dir))
}

/// A path's components as lookup takes them (`.` and empty ones dropped).
fn components(path: &str) -> impl Iterator<Item = String> + '_ {
    path.split('/')
        .filter(|c| !c.is_empty() && *c != ".")
        .map(str::to_string)
}

/// overlayfs' opaque marker on a directory of an unpacked layer.
fn opaque(dir: &Path) -> bool {
    // lgetxattr: a symlink's own attributes, as overlayfs reads them.
    matches!(xattr::get(dir, "trusted.overlay.opaque"), Ok(Some(v)) if v == b"y")
}

fn parse_passwd(s: &str) -> Vec<PasswdEntry> {
    s.lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split(':').collect();
            if f.len() < 7 || l.starts_with('#') {
                return None;
            }
            Some(PasswdEntry {
                name: f[0].to_string(),
                uid: f[2].parse().ok()?,
                gid: f[3].parse().ok()?,
                home: f[5].to_string(),
            })
        })
        .collect()
}

fn parse_group(s: &str) -> Vec<GroupEntry> {
    s.lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split(':').collect();
            if f.len() < 4 || l.starts_with('#') {
                return None;
            }
            Some(GroupEntry {
                name: f[0].to_string(),
                gid: f[2].parse().ok()?,
                members: f[3].split(',').filter(|m| !m.is_empty()).map(str::to_string).collect(),
            })
        })
        .collect()
}

/// Work out uid, gid and groups the way containerd's CRI does: an explicit uid wins over the
/// image's User; the primary gid comes from runAsGroup, else the user spec's group, else the
/// passwd entry, else 0. The supplementary groups are the primary gid first (containerd's
/// ensureAdditionalGids: `id` shows `groups=<gid>,...`), then with `merge_image_groups`
/// (Kubernetes `supplementalGroupsPolicy: Merge`, the default) the groups the user is a member
/// of in the image's /etc/group, then the supplemental groups (supplementalGroups, fsGroup).
pub(crate) fn resolve_user(
    files: &ImageFiles,
    image_user: &str,
    uid_override: Option<u32>,
    gid_override: Option<u32>,
    supplemental: &[u32],
    merge_image_groups: bool,
) -> Result<ResolvedUser> {
    let bad = |reason: String| Error::invalid_config("user", reason);
    // A file the container could not read either is as good as none, unless a name has to be
    // looked up in it.
    let named = |part: Option<&str>| part.is_some_and(|p| !p.is_empty() && p.parse::<u32>().is_err());
    let (user_part, group_part) = match image_user.split_once(':') {
        Some((u, g)) => (u, Some(g)),
        None => (image_user, None),
    };
    let read = |path: &str, needed: bool| match files.read(path) {
        Ok(s) => Ok(s),
        Err(e) if needed => Err(bad(format!("reading the image's {e}"))),
        Err(_) => Ok(None),
    };
    let passwd = read("/etc/passwd", uid_override.is_none() && named(Some(user_part)))?
        .map(|s| parse_passwd(&s))
        .unwrap_or_default();
    let groups = read("/etc/group", uid_override.is_none() && named(group_part))?
        .map(|s| parse_group(&s))
        .unwrap_or_default();

    let entry = if let Some(uid) = uid_override {
        passwd
            .iter()
            .find(|e| e.uid == uid)
            .cloned()
            .map(Ok)
            .unwrap_or(Err(uid))
    } else if user_part.is_empty() {
        passwd.iter().find(|e| e.uid == 0).cloned().map(Ok).unwrap_or(Err(0))
    } else if let Ok(uid) = user_part.parse::<u32>() {
        passwd
            .iter()
            .find(|e| e.uid == uid)
            .cloned()
            .map(Ok)
            .unwrap_or(Err(uid))
    } else {
        Ok(passwd
            .iter()
            .find(|e| e.name == user_part)
            .cloned()
            .ok_or_else(|| bad(format!("user {user_part:?} is not in the image's /etc/passwd")))?)
    };
    let (uid, passwd_gid, name, home) = match entry {
        Ok(e) => (e.uid, Some(e.gid), Some(e.name), Some(e.home)),
        Err(uid) => (uid, None, None, None),
    };
    let spec_gid = match group_part.filter(|_| uid_override.is_none()) {
        Some(g) if !g.is_empty() => Some(match g.parse::<u32>() {
            Ok(gid) => gid,
            Err(_) => groups
                .iter()
                .find(|e| e.name == g)
                .map(|e| e.gid)
                .ok_or_else(|| bad(format!("group {g:?} is not in the image's /etc/group")))?,
        }),
        _ => None,
    };
    let gid = gid_override.or(spec_gid).or(passwd_gid).unwrap_or(0);
    let mut additional = vec![gid];
    if let Some(n) = name.as_ref().filter(|_| merge_image_groups) {
        // containerd's WithAdditionalGIDs: groups listing the user as a member, not the
        // user's own (same-named) group.
        for g in &groups {
            if &g.name != n && g.members.iter().any(|m| m == n) && !additional.contains(&g.gid) {
                additional.push(g.gid);
            }
        }
    }
    for g in supplemental {
        if !additional.contains(g) {
            additional.push(*g);
        }
    }
    Ok(ResolvedUser {
        uid,
        gid,
        additional_gids: additional,
        name,
        home,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn image(passwd: &str, group: &str) -> (tempfile::TempDir, ImageFiles) {
        let d = tempfile::tempdir().unwrap();
        let l1 = d.path().join("l1");
        fs::create_dir_all(l1.join("etc")).unwrap();
        fs::write(l1.join("etc/passwd"), passwd).unwrap();
        fs::write(l1.join("etc/group"), group).unwrap();
        let f = ImageFiles::new(&[l1]);
        (d, f)
    }

    const PASSWD: &str = "root:x:0:0:root:/root:/bin/sh\nwww:x:33:33:www:/var/www:/bin/sh\n";
    const GROUP: &str = "root:x:0:\nwww:x:33:\nstaff:x:50:www\n";

    #[test]
    fn names_and_numbers() {
        let (_d, f) = image(PASSWD, GROUP);
        let u = resolve_user(&f, "www", None, None, &[], true).unwrap();
        assert_eq!((u.uid, u.gid, u.additional_gids.clone()), (33, 33, vec![33, 50]));
        assert_eq!(u.home.as_deref(), Some("/var/www"));
        let u = resolve_user(&f, "1000:staff", None, None, &[7], true).unwrap();
        assert_eq!((u.uid, u.gid, u.additional_gids), (1000, 50, vec![50, 7]));
        let u = resolve_user(&f, "", None, None, &[], true).unwrap();
        assert_eq!((u.uid, u.gid), (0, 0));
    }

    #[test]
    fn overrides_win() {
        let (_d, f) = image(PASSWD, GROUP);
        let u = resolve_user(&f, "www", Some(33), Some(5), &[], true).unwrap();
        assert_eq!((u.uid, u.gid), (33, 5));
        let u = resolve_user(&f, "root", Some(1234), None, &[], true).unwrap();
        assert_eq!((u.uid, u.gid, u.name), (1234, 0, None));
    }

    #[test]
    fn run_as_group_joins_the_supplementary_groups_as_containerd_does() {
        // The Kubernetes documentation's security-context example: runAsUser 1000,
        // runAsGroup 3000, fsGroup 2000, supplementalGroups [4000].
        let (_d, f) = image(PASSWD, GROUP);
        let u = resolve_user(&f, "", Some(1000), Some(3000), &[4000, 2000], true).unwrap();
        assert_eq!((u.uid, u.gid, u.additional_gids), (1000, 3000, vec![3000, 4000, 2000]));
        // A primary gid also listed as supplemental appears once.
        let u = resolve_user(&f, "", Some(1000), Some(3000), &[3000], true).unwrap();
        assert_eq!(u.additional_gids, vec![3000]);
    }

    #[test]
    fn strict_policy_leaves_out_the_image_groups() {
        let group = "root:x:0:\nwww:x:33:www\nstaff:x:50:www\nadm:x:4:root,www\n";
        let (_d, f) = image(PASSWD, group);
        let merged = resolve_user(&f, "www", None, None, &[1234], true).unwrap();
        // Not the user's own group "www" (it is the primary one anyway), the others in order.
        assert_eq!(merged.additional_gids, vec![33, 50, 4, 1234]);
        let strict = resolve_user(&f, "www", None, None, &[1234], false).unwrap();
        assert_eq!(strict.additional_gids, vec![33, 1234]);
        // By uid, the passwd name is what /etc/group is searched for.
        let by_uid = resolve_user(&f, "", Some(33), None, &[], true).unwrap();
        assert_eq!(by_uid.additional_gids, vec![33, 50, 4]);
    }

    #[test]
    fn unknown_name_is_an_error_naming_it() {
        let (_d, f) = image(PASSWD, GROUP);
        let e = resolve_user(&f, "nobody", None, None, &[], true).unwrap_err();
        assert!(e.to_string().contains("nobody"));
    }

    #[test]
    fn upper_layer_whiteout_hides_file() {
        let d = tempfile::tempdir().unwrap();
        let l1 = d.path().join("l1");
        let l2 = d.path().join("l2");
        fs::create_dir_all(l1.join("etc")).unwrap();
        fs::create_dir_all(l2.join("etc")).unwrap();
        fs::write(l1.join("etc/passwd"), PASSWD).unwrap();
        fs::create_dir(l2.join("etc/passwd")).unwrap(); // stands in for a whiteout
        let f = ImageFiles::new(&[l1, l2]);
        assert_eq!(f.read("/etc/passwd").unwrap(), None);
    }

    fn layer(d: &Path, name: &str) -> PathBuf {
        let l = d.join(name);
        fs::create_dir_all(l.join("etc")).unwrap();
        l
    }

    #[test]
    fn a_symlink_cycle_is_an_error_only_where_a_name_is_needed() {
        let d = tempfile::tempdir().unwrap();
        let l = layer(d.path(), "l1");
        std::os::unix::fs::symlink("p2", l.join("etc/passwd")).unwrap();
        std::os::unix::fs::symlink("passwd", l.join("etc/p2")).unwrap();
        let f = ImageFiles::new(&[l]);
        let e = f.read("/etc/passwd").unwrap_err();
        assert!(e.contains("too many levels of symbolic links"), "{e}");
        let e = resolve_user(&f, "www", None, None, &[], true).unwrap_err();
        assert!(e.to_string().contains("too many levels"), "{e}");
        // a numeric user needs no name: the container runs
        let u = resolve_user(&f, "1000", None, None, &[], true).unwrap();
        assert_eq!((u.uid, u.gid), (1000, 0));
    }

    #[test]
    fn a_huge_passwd_is_refused_unread() {
        let d = tempfile::tempdir().unwrap();
        let l = layer(d.path(), "l1");
        let f = fs::File::create(l.join("etc/passwd")).unwrap();
        f.set_len(MAX_FILE + 1).unwrap(); // sparse: nothing is written
        let files = ImageFiles::new(&[l]);
        let e = files.read("/etc/passwd").unwrap_err();
        assert!(e.contains("more than the"), "{e}");
        assert!(resolve_user(&files, "root", None, None, &[], true).is_err());
    }

    #[test]
    fn symlinks_resolve_inside_the_image_never_on_the_node() {
        let d = tempfile::tempdir().unwrap();
        // the "node": a passwd with uid 4242 for root
        let node = d.path().join("node-etc");
        fs::create_dir_all(&node).unwrap();
        fs::write(node.join("passwd"), "root:x:4242:4242:root:/root:/bin/sh\n").unwrap();
        let l = d.path().join("l1");
        fs::create_dir_all(&l).unwrap();
        // /etc is a link to the node's directory (absolute), and to it by .. (relative)
        std::os::unix::fs::symlink(&node, l.join("etc")).unwrap();
        let files = ImageFiles::new(std::slice::from_ref(&l));
        assert_eq!(files.read("/etc/passwd").unwrap(), None, "the node's file was read");
        let u = resolve_user(&files, "", None, None, &[], true).unwrap();
        assert_eq!(u.uid, 0, "the image's root is 0 whatever the node says");
        fs::remove_file(l.join("etc")).unwrap();
        std::os::unix::fs::symlink(
            "../../../../../../../../..".to_string() + &node.display().to_string(),
            l.join("etc"),
        )
        .unwrap();
        assert_eq!(files.read("/etc/passwd").unwrap(), None);
        // a link that stays inside the image works, .. stopping at its root
        fs::remove_file(l.join("etc")).unwrap();
        fs::create_dir_all(l.join("usr/etc")).unwrap();
        fs::write(l.join("usr/etc/passwd"), PASSWD).unwrap();
        std::os::unix::fs::symlink("../../../usr/etc", l.join("etc")).unwrap();
        let u = resolve_user(&files, "www", None, None, &[], true).unwrap();
        assert_eq!(u.uid, 33);
    }

    #[test]
    fn the_union_of_layers_as_overlayfs_shows_it() {
        let d = tempfile::tempdir().unwrap();
        let lower = layer(d.path(), "lower");
        let upper = layer(d.path(), "upper");
        fs::write(lower.join("etc/passwd"), PASSWD).unwrap();
        fs::write(lower.join("etc/group"), GROUP).unwrap();
        // the upper layer's /etc merges with the lower's: passwd still shows through
        let f = ImageFiles::new(&[lower.clone(), upper.clone()]);
        assert!(f.read("/etc/passwd").unwrap().is_some());
        // a whiteout in the upper hides it
        nix::sys::stat::mknod(
            &upper.join("etc/passwd"),
            nix::sys::stat::SFlag::S_IFCHR,
            nix::sys::stat::Mode::empty(),
            0,
        )
        .unwrap();
        assert_eq!(f.read("/etc/passwd").unwrap(), None);
        // an opaque upper /etc hides every lower entry
        let _ = xattr_set(&upper.join("etc"), "trusted.overlay.opaque", b"y");
        if opaque(&upper.join("etc")) {
            assert_eq!(f.read("/etc/group").unwrap(), None);
        }
    }

    fn xattr_set(p: &Path, name: &str, value: &[u8]) -> std::io::Result<()> {
        // lsetxattr: never through a symlink.
        xattr::set(p, name, value)
    }
}
