//! Platforms as containerd normalizes and matches them: GOARCH names (`x86_64` is `amd64`,
//! `aarch64` is `arm64`), arm64's variant defaulting to `v8` and arm's to `v7`, and the
//! preference order `platforms.Only` gives: linux/arm64/v8 also runs linux/arm/v8..v5 (in
//! that order), linux/arm/v7 runs v6 and v5, linux/amd64/vN runs lower amd64 variants and
//! then linux/386.

use super::{Platform, PullError};

/// (architecture, variant) spelled as containerd's `Normalize` does; `None` variant where
/// the default applies.
fn normalize(arch: &str, variant: Option<&str>) -> (String, Option<String>) {
    let variant = variant.filter(|v| !v.is_empty());
    match arch.to_ascii_lowercase().as_str() {
        "i386" | "386" => ("386".into(), None),
        "x86_64" | "x86-64" | "amd64" => (
            "amd64".into(),
            match variant {
                None | Some("v1") => None,
                Some(v) => Some(v.to_string()),
            },
        ),
        "aarch64" | "arm64" => (
            "arm64".into(),
            match variant {
                None | Some("8") | Some("v8") | Some("v8.0") => None,
                Some("9") | Some("9.0") | Some("v9.0") => Some("v9".into()),
                Some(v) if !v.starts_with('v') => Some(format!("v{v}")),
                Some(v) => Some(v.to_string()),
            },
        ),
        "armhf" => ("arm".into(), Some("v7".into())),
        "armel" => ("arm".into(), Some("v6".into())),
        "arm" => (
            "arm".into(),
            Some(match variant {
                None | Some("7") => "v7".to_string(),
                Some(v) if !v.starts_with('v') => format!("v{v}"),
                Some(v) => v.to_string(),
            }),
        ),
        other => (other.to_string(), variant.map(str::to_string)),
    }
}

impl Platform {
    /// This machine's platform: linux, its GOARCH name, and for arm the variant
    /// (`v8` for arm64; for 32-bit arm the CPU architecture /proc/cpuinfo gives, else `v7`).
    pub fn host() -> Platform {
        let (architecture, variant) = match std::env::consts::ARCH {
            "x86_64" => ("amd64".to_string(), None),
            "aarch64" => ("arm64".to_string(), Some("v8".to_string())),
            "arm" => ("arm".to_string(), Some(arm_variant())),
            "x86" => ("386".to_string(), None),
            "powerpc64" => ("ppc64".to_string(), None),
            "s390x" => ("s390x".to_string(), None),
            "riscv64" => ("riscv64".to_string(), None),
            other => (other.to_string(), None),
        };
        Platform {
            os: std::env::consts::OS.to_string(),
            architecture,
            variant,
        }
    }

    /// `os/arch[/variant]`, e.g. `linux/arm64/v8`; the names are normalized (`x86_64` is
    /// `amd64`, `aarch64` is `arm64`).
    pub fn parse(s: &str) -> Result<Platform, PullError> {
        let parts: Vec<&str> = s.split('/').collect();
        let bad = |why: &str| PullError::Config(format!("platform {s:?}: {why}; expected os/arch[/variant]"));
        if parts.len() < 2 || parts.len() > 3 || parts.iter().any(|p| p.is_empty()) {
            return Err(bad("wrong number of parts"));
        }
        let ok = |p: &str| {
            p.chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '.' || c == '-')
        };
        if !parts.iter().all(|p| ok(p)) {
            return Err(bad("invalid characters"));
        }
        let os = parts[0].to_ascii_lowercase();
        let (architecture, variant) = normalize(parts[1], parts.get(2).copied());
        // Keep arm64's default variant explicit, as Platform::host has it.
        let variant = match (architecture.as_str(), variant) {
            ("arm64", None) => Some("v8".to_string()),
            (_, v) => v,
        };
        Ok(Platform {
            os,
            architecture,
            variant,
        })
    }

    /// The platforms this one runs, most preferred first (containerd's `platforms.Only`).
    pub(crate) fn preference(&self) -> Vec<(String, String, Option<String>)> {
        let (arch, variant) = normalize(&self.architecture, self.variant.as_deref());
        let os = self.os.to_ascii_lowercase();
        let mut out = vec![(os.clone(), arch.clone(), variant.clone())];
        let vnum = |v: &Option<String>| v.as_deref().and_then(|v| v.trim_start_matches('v').parse::<u32>().ok());
        match arch.as_str() {
            "amd64" => {
                if let Some(n) = vnum(&variant) {
                    for k in (1..n).rev() {
                        out.push((os.clone(), "amd64".into(), (k > 1).then(|| format!("v{k}"))));
                    }
                }
                out.push((os.clone(), "386".into(), None));
            }
            "arm" => {
                if let Some(n) = vnum(&variant) {
                    for k in (5..n).rev() {
                        out.push((os.clone(), "arm".into(), Some(format!("v{k}"))));
                    }
                }
            }
            "arm64" => {
                let v = variant.clone().unwrap_or_else(|| "v8".into());
                let arm = Platform {
                    os: os.clone(),
                    architecture: "arm".into(),
                    variant: Some(v),
                };
                out.extend(arm.preference());
            }
            _ => {}
        }
        out
    }

    /// Where `os/arch/variant` (as an index or a config gives them) is in this platform's
    /// preference, `None` when it cannot run it.
    pub fn rank(&self, os: &str, architecture: &str, variant: Option<&str>) -> Option<usize> {
        let (arch, variant) = normalize(architecture, variant);
        let os = os.to_ascii_lowercase();
        self.preference()
            .iter()
            .position(|(o, a, v)| o == &os && a == &arch && v == &variant)
    }
}

impl std::fmt::Display for Platform {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.os, self.architecture)?;
        if let Some(v) = &self.variant {
            write!(f, "/{v}")?;
        }
        Ok(())
    }
}

fn arm_variant() -> String {
    let info = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    for line in info.lines() {
        if let Some((k, v)) = line.split_once(':') {
            if k.trim().eq_ignore_ascii_case("CPU architecture") {
                let v = v.trim();
                return match v {
                    "AArch64" | "8" => "v8".into(),
                    "7" => "v7".into(),
                    "6" => "v6".into(),
                    "5" | "5T" | "5TE" | "5TEJ" => "v5".into(),
                    _ => "v7".into(),
                };
            }
        }
    }
    "v7".into()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(s: &str) -> Platform {
        Platform::parse(s).unwrap()
    }

    #[test]
    fn parse_normalizes() {
        assert_eq!(
            p("linux/aarch64"),
            Platform {
                os: "linux".into(),
                architecture: "arm64".into(),
                variant: Some("v8".into())
            }
        );
        assert_eq!(p("linux/x86_64").architecture, "amd64");
        assert_eq!(p("linux/arm").variant.as_deref(), Some("v7"));
        assert_eq!(p("linux/armhf").variant.as_deref(), Some("v7"));
        assert_eq!(p("linux/arm/6").variant.as_deref(), Some("v6"));
        assert_eq!(p("linux/arm64/v8").to_string(), "linux/arm64/v8");
        for bad in ["linux", "linux/", "a/b/c/d", "linux/am d64"] {
            let e = Platform::parse(bad).unwrap_err();
            assert!(e.to_string().contains("os/arch"), "{e}");
        }
        let host = Platform::host();
        assert_eq!(host.os, "linux");
        assert!(host.rank(&host.os, &host.architecture, host.variant.as_deref()) == Some(0));
    }

    #[test]
    fn matching_follows_containerds_preference() {
        let arm64 = p("linux/arm64");
        assert_eq!(arm64.rank("linux", "arm64", None), Some(0));
        assert_eq!(arm64.rank("linux", "arm64", Some("v8")), Some(0));
        assert_eq!(arm64.rank("linux", "arm", Some("v7")), Some(2));
        assert!(arm64.rank("linux", "arm", Some("v8")) < arm64.rank("linux", "arm", Some("v7")));
        assert_eq!(arm64.rank("linux", "amd64", None), None);
        assert_eq!(arm64.rank("windows", "arm64", None), None);

        let armv7 = p("linux/arm/v7");
        assert_eq!(armv7.rank("linux", "arm", None), Some(0));
        assert_eq!(armv7.rank("linux", "arm", Some("v6")), Some(1));
        assert_eq!(armv7.rank("linux", "arm", Some("v8")), None);
        assert_eq!(armv7.rank("linux", "arm64", None), None);

        let amd64 = p("linux/amd64");
        assert_eq!(amd64.rank("linux", "amd64", Some("v1")), Some(0));
        assert_eq!(amd64.rank("linux", "386", None), Some(1));
        assert_eq!(amd64.rank("linux", "amd64", Some("v3")), None);
        assert_eq!(amd64.rank("unknown", "unknown", None), None);
        let v3 = p("linux/amd64/v3");
        assert_eq!(v3.rank("linux", "amd64", Some("v2")), Some(1));
        assert_eq!(v3.rank("linux", "amd64", None), Some(2));
    }
}
