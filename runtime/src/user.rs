//! Resolving a container's user from the image: `User` may be `name`, `uid`, `name:group` or
//! `uid:gid`, and names are looked up in the image's own /etc/passwd and /etc/group (read from
//! the unpacked layers, top layer first, never from the node).

use std::fs;
use std::path::{Path, PathBuf};

use crate::error::{Error, Result};

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResolvedUser {
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

/// Reads files of the image as the container will see them, from layer directories.
pub struct ImageFiles {
    /// Top layer first.
    layers: Vec<PathBuf>,
}

impl ImageFiles {
    /// `layers` bottom first, as the image lists them.
    pub fn new(layers: &[PathBuf]) -> Self {
        ImageFiles {
            layers: layers.iter().rev().cloned().collect(),
        }
    }

    /// The content of `path` (absolute in the image), following the overlay rules far enough
    /// for /etc files: the topmost layer that has it or a whiteout for it decides.
    pub fn read(&self, path: &str) -> Option<String> {
        let rel = path.trim_start_matches('/');
        for layer in &self.layers {
            let p = layer.join(rel);
            match fs::symlink_metadata(&p) {
                Ok(m) if m.file_type().is_file() => {
                    return fs::read_to_string(&p).ok();
                }
                Ok(m) if m.file_type().is_symlink() => {
                    // Resolve a link inside the image only (never on the node).
                    let target = fs::read_link(&p).ok()?;
                    let abs = if target.is_absolute() {
                        target
                    } else {
                        Path::new(path).parent()?.join(target)
                    };
                    let s = abs.to_string_lossy().into_owned();
                    if s == path {
                        return None;
                    }
                    return self.read(&s);
                }
                Ok(_) => return None, // a whiteout (char device) or a directory
                Err(_) => {}
            }
        }
        None
    }
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
pub fn resolve_user(
    files: &ImageFiles,
    image_user: &str,
    uid_override: Option<u32>,
    gid_override: Option<u32>,
    supplemental: &[u32],
    merge_image_groups: bool,
) -> Result<ResolvedUser> {
    let passwd = files.read("/etc/passwd").map(|s| parse_passwd(&s)).unwrap_or_default();
    let groups = files.read("/etc/group").map(|s| parse_group(&s)).unwrap_or_default();
    let bad = |reason: String| Error::invalid_config("user", reason);

    let (user_part, group_part) = match image_user.split_once(':') {
        Some((u, g)) => (u, Some(g)),
        None => (image_user, None),
    };
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
        assert!(f.read("/etc/passwd").is_none());
    }
}
