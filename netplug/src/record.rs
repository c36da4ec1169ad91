//! Per-sandbox records: one JSON file per sandbox under `<state_dir>/sandboxes/`, written
//! atomically before anything is created for the sandbox and updated as setup progresses, so
//! that `teardown_by_id` and `gc` can undo everything after an agent crash, from the record
//! alone.

use std::path::{Path, PathBuf};

use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::error::Result;
use ferrolet_fsutil as fsutil;

#[derive(Debug, Clone)]
pub struct Records {
    dir: PathBuf,
}

impl Records {
    pub fn new(state_dir: &Path) -> Result<Self> {
        let dir = state_dir.join("sandboxes");
        fsutil::ensure_dir(&dir)?;
        Ok(Records { dir })
    }

    fn path(&self, id: &str) -> PathBuf {
        self.dir.join(format!("{}.json", fsutil::safe_name(id)))
    }

    pub fn write<T: Serialize>(&self, id: &str, rec: &T) -> Result<()> {
        Ok(fsutil::write_json_atomic(&self.path(id), rec)?)
    }

    pub fn read<T: DeserializeOwned>(&self, id: &str) -> Result<Option<T>> {
        Ok(fsutil::read_json_opt(&self.path(id))?)
    }

    /// Remove the record; a missing one is fine.
    pub fn remove(&self, id: &str) -> Result<()> {
        if fsutil::remove_file_opt(&self.path(id))? {
            fsutil::sync_dir(&self.dir);
        }
        Ok(())
    }

    /// Ids of every recorded sandbox.
    pub fn ids(&self) -> Result<Vec<String>> {
        Ok(fsutil::list_names(&self.dir)?
            .into_iter()
            .filter_map(|n| n.strip_suffix(".json").map(str::to_string))
            .collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn write_read_list_remove() {
        let dir = tempfile::tempdir().unwrap();
        let r = Records::new(dir.path()).unwrap();
        r.write("a1", &vec![1, 2]).unwrap();
        r.write("b2", &vec![3]).unwrap();
        assert_eq!(r.read::<Vec<i32>>("a1").unwrap(), Some(vec![1, 2]));
        assert_eq!(r.ids().unwrap(), vec!["a1".to_string(), "b2".to_string()]);
        r.remove("a1").unwrap();
        r.remove("a1").unwrap();
        assert_eq!(r.read::<Vec<i32>>("a1").unwrap(), None);
    }
}
