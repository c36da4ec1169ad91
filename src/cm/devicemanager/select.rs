//! Which devices of one resource a container gets (kubelet's devicesToAllocate, without
//! topology): its pod's init containers' devices first (kubelet's reusable devices: a regular
//! init container has finished before the next container starts), then the ones the plugin
//! prefers (GetPreferredAllocation, when it offers it) that are free, then free ones in order.
//! Pure, so the rules are unit-tested here; the manager holds the lock and makes the calls.

use std::collections::{BTreeMap, BTreeSet};

use super::allocation::Entry;
use super::Device;

/// The devices of one resource a container may be given.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Candidates {
    /// Healthy devices its pod's regular init containers hold and none of its other
    /// containers: the container takes them first (GetPreferredAllocation's must-include).
    pub reusable: Vec<String>,
    /// Healthy devices no container holds, the reusable ones left out.
    pub free: Vec<String>,
}

impl Candidates {
    /// The devices of `devices` that container `container` of pod `uid` may be given, beside
    /// the `allocations` (its own container's left out).
    pub fn of(
        devices: &BTreeMap<String, Device>,
        allocations: &[Entry],
        uid: &str,
        container: &str,
        resource: &str,
    ) -> Candidates {
        let of_resource = || allocations.iter().filter(|e| e.resource == resource);
        let held: BTreeSet<&str> = of_resource()
            .filter(|e| !(e.pod_uid == uid && (e.init || e.container == container)))
            .flat_map(|e| e.ids.iter().map(String::as_str))
            .collect();
        let from_init: BTreeSet<&str> = of_resource()
            .filter(|e| e.pod_uid == uid && e.init && e.container != container)
            .flat_map(|e| e.ids.iter().map(String::as_str))
            .collect();
        let mut out = Candidates::default();
        for (id, d) in devices {
            if !d.healthy || held.contains(id.as_str()) {
                continue;
            }
            if from_init.contains(id.as_str()) {
                out.reusable.push(id.clone());
            } else {
                out.free.push(id.clone());
            }
        }
        out
    }

    /// Can `n` devices be given at all?
    pub fn enough(&self, n: usize) -> bool {
        self.reusable.len() + self.free.len() >= n
    }

    /// Is the plugin to be asked which ones it prefers? Not when the reusable devices are
    /// enough (kubelet takes them without asking).
    pub fn ask_plugin(&self, n: usize) -> bool {
        self.reusable.len() < n
    }

    /// What GetPreferredAllocation is asked: the devices available (the reusable ones
    /// included), the ones that must be in the answer, in ID order.
    pub fn preferred_request(&self) -> (Vec<String>, Vec<String>) {
        let mut available: Vec<String> = self.reusable.iter().chain(&self.free).cloned().collect();
        available.sort();
        (available, self.reusable.clone())
    }

    /// Why the plugin's preferred `answer` for `n` devices cannot be taken as it is, if it
    /// cannot: every device available, the reusable ones in it, `n` of them, none twice.
    pub fn check_preferred(&self, n: usize, answer: &[String]) -> Result<(), String> {
        let mut seen = BTreeSet::new();
        for id in answer {
            if !seen.insert(id.as_str()) {
                return Err(format!("device {id:?} is in it twice"));
            }
            if !self.reusable.contains(id) && !self.free.contains(id) {
                return Err(format!("device {id:?} is not one of the available devices"));
            }
        }
        if let Some(missing) = self.reusable.iter().take(n).find(|id| !seen.contains(id.as_str())) {
            return Err(format!("the must-include device {missing:?} is not in it"));
        }
        if answer.len() != n {
            return Err(format!("{} devices, not the {n} asked for", answer.len()));
        }
        Ok(())
    }

    /// The `n` devices to give, as kubelet picks them: the reusable ones first, then those of
    /// the plugin's `preferred` answer that are free (in its order), then free ones in ID
    /// order; sorted. `None` when there are not `n`.
    pub fn pick(&self, n: usize, preferred: Option<&[String]>) -> Option<Vec<String>> {
        let mut out: Vec<String> = Vec::with_capacity(n);
        let preferred_free = preferred.unwrap_or_default().iter().filter(|id| self.free.contains(id));
        for id in self.reusable.iter().chain(preferred_free).chain(&self.free) {
            if out.len() == n {
                break;
            }
            if !out.contains(id) {
                out.push(id.clone());
            }
        }
        if out.len() < n {
            return None;
        }
        out.sort();
        Some(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn devs(list: &[(&str, bool)]) -> BTreeMap<String, Device> {
        list.iter()
            .map(|(id, h)| (id.to_string(), Device { healthy: *h }))
            .collect()
    }

    fn held(uid: &str, container: &str, init: bool, ids: &[&str]) -> Entry {
        Entry {
            pod_uid: uid.into(),
            container: container.into(),
            init,
            resource: "r".into(),
            ids: ids.iter().map(|s| s.to_string()).collect(),
            response: Default::default(),
            pending: false,
        }
    }

    fn ids(list: &[&str]) -> Vec<String> {
        list.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn candidates_leave_out_unhealthy_and_held_devices_and_reuse_init_ones() {
        let d = devs(&[("a", true), ("b", true), ("c", false), ("d", true), ("e", true)]);
        let a = [
            held("other", "app", false, &["a"]),
            held("u", "init", true, &["b", "d"]),
            // another app container of the same pod took d from the init container
            held("u", "app2", false, &["d"]),
        ];
        let c = Candidates::of(&d, &a, "u", "app", "r");
        assert_eq!(c.reusable, ["b"]);
        assert_eq!(c.free, ["e"]);
        assert!(c.enough(2) && !c.enough(3));
        // another pod sees none of them as reusable, and none of u's as free
        let c = Candidates::of(&d, &a, "v", "app", "r");
        assert_eq!((c.reusable.len(), c.free), (0, ids(&["e"])));
        // other resources' allocations do not count
        let c = Candidates::of(&d, &a, "v", "app", "other");
        assert_eq!(c.free, ["a", "b", "d", "e"]);
    }

    #[test]
    fn the_plugin_is_asked_only_when_the_reusable_devices_are_not_enough() {
        let c = Candidates {
            reusable: ids(&["b"]),
            free: ids(&["c", "a"]),
        };
        assert!(!c.ask_plugin(1));
        assert!(c.ask_plugin(2));
        assert_eq!(c.preferred_request(), (ids(&["a", "b", "c"]), ids(&["b"])));
        assert_eq!(c.pick(1, None), Some(ids(&["b"])));
    }

    #[test]
    fn a_valid_preferred_answer_is_taken() {
        let c = Candidates {
            reusable: ids(&["b"]),
            free: ids(&["a", "c", "d"]),
        };
        let answer = ids(&["d", "b"]);
        assert_eq!(c.check_preferred(2, &answer), Ok(()));
        assert_eq!(c.pick(2, Some(&answer)), Some(ids(&["b", "d"])));
        // without an answer, the first free ones
        assert_eq!(c.pick(2, None), Some(ids(&["a", "b"])));
        assert_eq!(c.pick(5, None), None);
    }

    #[test]
    fn a_bad_preferred_answer_is_named_and_its_usable_part_kept() {
        let c = Candidates {
            reusable: ids(&["b"]),
            free: ids(&["a", "c", "d"]),
        };
        for (answer, why) in [
            (ids(&["b", "x"]), "\"x\" is not one of the available"),
            (ids(&["d", "c"]), "must-include device \"b\""),
            (ids(&["b", "d", "c"]), "3 devices, not the 2"),
            (ids(&["b"]), "1 devices, not the 2"),
            (ids(&["b", "b"]), "twice"),
        ] {
            let e = c.check_preferred(2, &answer).unwrap_err();
            assert!(e.contains(why), "{answer:?}: {e}");
        }
        // kubelet's fallback: the reusable device, then what the answer has that is free,
        // then the first free ones
        assert_eq!(c.pick(2, Some(&ids(&["x", "d"]))), Some(ids(&["b", "d"])));
        assert_eq!(c.pick(3, Some(&ids(&["x", "d"]))), Some(ids(&["a", "b", "d"])));
        assert_eq!(c.pick(2, Some(&ids(&["d", "c"]))), Some(ids(&["b", "d"])));
    }
}
