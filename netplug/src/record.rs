//! Per-sandbox records: one JSON file per sandbox under `<state_dir>/sandboxes/`, written
//! atomically before anything is created for the sandbox and updated as setup progresses, so
//! that `teardown_by_id` and `gc` can undo everything after an agent crash, from the record
//! alone. Writes and removals are fsync'd: they run on tokio's blocking pool.

use std::path::{Path, PathBuf};

use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::error::{Context, Result};
use ferrolet_fsutil as fsutil;

#[derive(Debug, Clone)]
pub(crate) struct Records {
    dir: PathBuf,
}

impl Records {
    pub(crate) fn new(state_dir: &Path) -> Result<Self> {
        let dir = state_dir.join("sandboxes");
        fsutil::ensure_dir(&dir)?;
        Ok(Records { dir })
    }

    fn path(&self, id: &str) -> PathBuf {
        self.dir.join(format!("{}.json", fsutil::safe_name(id)))
    }

    pub(crate) async fn write<T: Serialize>(&self, id: &str, rec: &T) -> Result<()> {
        let path = self.path(id);
        let data = serde_json::to_vec_pretty(rec).with_context(|| format!("encoding {}", path.display()))?;
        crate::blocking(move || fsutil::write_atomic(&path, &data)).await
    }

    pub(crate) fn read<T: DeserializeOwned>(&self, id: &str) -> Result<Option<T>> {
        Ok(fsutil::read_json_opt(&self.path(id))?)
    }

    /// Remove the record; a missing one is fine.
    pub(crate) async fn remove(&self, id: &str) -> Result<()> {
        let (path, dir) = (self.path(id), self.dir.clone());
        crate::blocking(move || {
            if fsutil::remove_file_opt(&path)? {
                fsutil::sync_dir(&dir);
            }
            Ok::<_, fsutil::Error>(())
        })
        .await
    }

    /// Ids of every recorded sandbox.
    pub(crate) fn ids(&self) -> Result<Vec<String>> {
        Ok(fsutil::list_names(&self.dir)?
            .into_iter()
            .filter_map(|n| n.strip_suffix(".json").map(str::to_string))
            .collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn write_read_list_remove() {
        let dir = tempfile::tempdir().unwrap();
        let r = Records::new(dir.path()).unwrap();
        r.write("a1", &vec![1, 2]).await.unwrap();
        r.write("b2", &vec![3]).await.unwrap();
        assert_eq!(r.read::<Vec<i32>>("a1").unwrap(), Some(vec![1, 2]));
        assert_eq!(r.ids().unwrap(), vec!["a1".to_string(), "b2".to_string()]);
        r.remove("a1").await.unwrap();
        r.remove("a1").await.unwrap();
        assert_eq!(r.read::<Vec<i32>>("a1").unwrap(), None);
    }
}
