//! How one setting's value is written in the KubeletConfiguration file, on the command line
//! and in `/configz`: a [`Codec`] per kind of value (a Go duration, a port, a quantity, a map
//! of eviction signals...). Each setting's declaration ([`super::settings`]) names its codec;
//! errors name the field (`fileCheckFrequency: ...`) or the flag (`--sync-frequency: ...`) as
//! kubelet's do.

use std::collections::BTreeMap;
use std::marker::PhantomData;
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{anyhow, bail, Result};
use clap::{value_parser, Arg, ArgAction};
use serde_json::{Map, Value};

use super::{absolute, resolve_relative, EvictionHard, NetworkMode, Reserved, Threshold, EVICTION_SIGNALS};
use crate::pod::units::{bytes, format_duration, parse_duration};

/// What reading a file needs besides the value: the file's directory (relative paths are
/// relative to it, as kubelet's) and where warnings about accepted-but-ignored values go.
pub struct FileCx<'a> {
    pub base: &'a Path,
    pub warnings: &'a mut Vec<String>,
}

/// One kind of setting value. Every method has a default so a codec implements only the forms
/// its settings have (a flag-only setting has no [`Codec::read`]).
pub trait Codec {
    type T;
    /// From the file; `f` names the field in errors (`authentication.webhook.cacheTTL`).
    fn read(f: &str, _v: &Value, _cx: &mut FileCx) -> Result<Self::T> {
        bail!("{f}: not a file setting")
    }
    /// From the values of the flag `--name` (all occurrences, after clap checked each with
    /// the parser [`Codec::arg`] gave it).
    fn flag(name: &str, _vals: &[String]) -> Result<Self::T> {
        bail!("--{name}: not a flag")
    }
    /// What the flag's value is called in `--help` (`--sync-frequency <DURATION>`).
    const VALUE_NAME: &'static str = "VALUE";
    /// The flag's clap shape: by default it takes one string value.
    fn arg(a: Arg) -> Arg {
        a.action(ArgAction::Set)
    }
    /// As `/configz` shows it (kubelet's v1beta1 JSON form); `null` leaves the field out.
    fn show(_t: &Self::T) -> Value {
        Value::Null
    }
}

pub(super) fn last(vals: &[String]) -> &str {
    vals.last().map(String::as_str).unwrap_or_default()
}

pub(super) fn string(f: &str, v: &Value) -> Result<String> {
    v.as_str()
        .map(str::to_string)
        .ok_or_else(|| anyhow!("{f}: expected a string, got {v}"))
}

fn boolean(f: &str, v: &Value) -> Result<bool> {
    v.as_bool()
        .ok_or_else(|| anyhow!("{f}: expected true or false, got {v}"))
}

pub(super) fn integer(f: &str, v: &Value) -> Result<i64> {
    v.as_i64().ok_or_else(|| anyhow!("{f}: expected an integer, got {v}"))
}

fn duration(f: &str, v: &Value) -> Result<Duration> {
    parse_duration(&string(f, v)?).map_err(|e| anyhow!("{f}: {e}"))
}

fn ip(f: &str, v: &Value) -> Result<IpAddr> {
    let s = string(f, v)?;
    s.parse().map_err(|_| anyhow!("{f}: {s:?} is not an IP address"))
}

pub(super) fn object<'a>(f: &str, v: &'a Value, what: &str) -> Result<&'a Map<String, Value>> {
    v.as_object().ok_or_else(|| anyhow!("{f}: expected {what}"))
}

fn list<'a>(f: &str, v: &'a Value, what: &str) -> Result<&'a Vec<Value>> {
    v.as_array().ok_or_else(|| anyhow!("{f}: expected {what}"))
}

fn path(p: &Path) -> Value {
    p.display().to_string().into()
}

/// `true` / `false`; the bare flag means true (`--fail-swap-on`).
pub struct Bool;
impl Codec for Bool {
    const VALUE_NAME: &'static str = "BOOL";
    type T = bool;
    fn read(f: &str, v: &Value, _: &mut FileCx) -> Result<bool> {
        boolean(f, v)
    }
    fn flag(name: &str, vals: &[String]) -> Result<bool> {
        last(vals)
            .parse()
            .map_err(|_| anyhow!("--{name}: expected true or false"))
    }
    fn arg(a: Arg) -> Arg {
        bool_arg(a)
    }
    fn show(t: &bool) -> Value {
        (*t).into()
    }
}

fn bool_arg(a: Arg) -> Arg {
    a.action(ArgAction::Set)
        .num_args(0..=1)
        .default_missing_value("true")
        .value_parser(value_parser!(bool))
        .hide_possible_values(true)
}

/// A boolean whose unset value is decided later by the mode (standalone or in a cluster);
/// `/configz` shows the resolved value.
pub struct OptBool;
impl Codec for OptBool {
    const VALUE_NAME: &'static str = "BOOL";
    type T = Option<bool>;
    fn read(f: &str, v: &Value, _: &mut FileCx) -> Result<Option<bool>> {
        boolean(f, v).map(Some)
    }
    fn flag(name: &str, vals: &[String]) -> Result<Option<bool>> {
        Bool::flag(name, vals).map(Some)
    }
    fn arg(a: Arg) -> Arg {
        bool_arg(a)
    }
    fn show(t: &Option<bool>) -> Value {
        (*t).into()
    }
}

/// A Go duration: `1m30s` in, `1m30s` out.
pub struct Dur;
impl Codec for Dur {
    const VALUE_NAME: &'static str = "DURATION";
    type T = Duration;
    fn read(f: &str, v: &Value, _: &mut FileCx) -> Result<Duration> {
        duration(f, v)
    }
    fn flag(name: &str, vals: &[String]) -> Result<Duration> {
        parse_duration(last(vals)).map_err(|e| anyhow!("--{name}: {e}"))
    }
    fn show(t: &Duration) -> Value {
        format_duration(*t).into()
    }
}

/// An integer field as kubelet's Go type has it (`int32`, `uint32`...): out of the type's
/// range is an error naming the field.
pub struct Int<T>(PhantomData<T>);

macro_rules! int_codec {
    ($($t:ty, $signed:literal);* $(;)?) => {$(
        impl Codec for Int<$t> {
            const VALUE_NAME: &'static str = "N";
            type T = $t;
            fn read(f: &str, v: &Value, _: &mut FileCx) -> Result<$t> {
                #[allow(clippy::useless_conversion)]
                <$t>::try_from(integer(f, v)?).map_err(|_| anyhow!("{f}: out of range"))
            }
            fn flag(name: &str, vals: &[String]) -> Result<$t> {
                last(vals).parse().map_err(|e| anyhow!("--{name}: {e}"))
            }
            fn arg(a: Arg) -> Arg {
                a.action(ArgAction::Set)
                    .value_parser(value_parser!($t))
                    .allow_negative_numbers($signed)
            }
            fn show(t: &$t) -> Value {
                (*t).into()
            }
        }
    )*};
}
int_codec!(u8, false; u32, false; i32, true; i64, true);

/// A port number (0 turns a listener off).
pub struct Port;
impl Codec for Port {
    const VALUE_NAME: &'static str = "PORT";
    type T = u16;
    fn read(f: &str, v: &Value, _: &mut FileCx) -> Result<u16> {
        let n = integer(f, v)?;
        u16::try_from(n).map_err(|_| anyhow!("{f}: {n} is not a port number"))
    }
    fn flag(name: &str, vals: &[String]) -> Result<u16> {
        Int::<u32>::flag(name, vals)
            .and_then(|n| u16::try_from(n).map_err(|_| anyhow!("--{name}: {n} is not a port number")))
    }
    fn arg(a: Arg) -> Arg {
        a.action(ArgAction::Set).value_parser(value_parser!(u16))
    }
    fn show(t: &u16) -> Value {
        (*t).into()
    }
}

/// A percentage of the image filesystem (imageGC*ThresholdPercent), checked by validation.
pub struct Percent;
impl Codec for Percent {
    const VALUE_NAME: &'static str = "PERCENT";
    type T = i32;
    fn read(f: &str, v: &Value, _: &mut FileCx) -> Result<i32> {
        let n = integer(f, v)?;
        i32::try_from(n).map_err(|_| anyhow!("{f}: {n} must be between 0 and 100, inclusive"))
    }
    fn flag(name: &str, vals: &[String]) -> Result<i32> {
        Int::<i32>::flag(name, vals)
    }
    fn arg(a: Arg) -> Arg {
        Int::<i32>::arg(a)
    }
    fn show(t: &i32) -> Value {
        (*t).into()
    }
}

/// eventRecordQPS: 0 is no limit.
pub struct EventQps;
impl Codec for EventQps {
    const VALUE_NAME: &'static str = "N";
    type T = u32;
    fn read(f: &str, v: &Value, _: &mut FileCx) -> Result<u32> {
        u32::try_from(integer(f, v)?)
            .map_err(|_| anyhow!("{f}: must be 0 (no limit) or a positive number of events a second"))
    }
    fn flag(name: &str, vals: &[String]) -> Result<u32> {
        Int::<u32>::flag(name, vals)
    }
    fn arg(a: Arg) -> Arg {
        Int::<u32>::arg(a)
    }
    fn show(t: &u32) -> Value {
        (*t).into()
    }
}

/// eventBurst: 0 is unset, and kubelet's defaulting fills in 100.
pub struct EventBurst;
impl Codec for EventBurst {
    const VALUE_NAME: &'static str = "N";
    type T = u32;
    fn read(f: &str, v: &Value, _: &mut FileCx) -> Result<u32> {
        match integer(f, v)? {
            0 => Ok(100),
            n => n.try_into().map_err(|_| anyhow!("{f}: must not be negative")),
        }
    }
    fn flag(name: &str, vals: &[String]) -> Result<u32> {
        Int::<u32>::flag(name, vals).map(|b| if b == 0 { 100 } else { b })
    }
    fn arg(a: Arg) -> Arg {
        Int::<u32>::arg(a)
    }
    fn show(t: &u32) -> Value {
        (*t).into()
    }
}

/// containerLogMaxWorkers, with kubelet's message for a value below 1.
pub struct LogWorkers;
impl Codec for LogWorkers {
    const VALUE_NAME: &'static str = "N";
    type T = u32;
    fn read(f: &str, v: &Value, _: &mut FileCx) -> Result<u32> {
        u32::try_from(integer(f, v)?)
            .map_err(|_| anyhow!("invalid configuration: containerLogMaxWorkers must be greater than or equal to 1"))
    }
    fn show(t: &u32) -> Value {
        (*t).into()
    }
}

/// registryPullQPS / registryBurst: kubelet's message for a negative value names both the
/// field and the flag.
macro_rules! non_negative_codec {
    ($name:ident, $field:literal, $flag:literal) => {
        pub struct $name;
        impl Codec for $name {
            const VALUE_NAME: &'static str = "N";
            type T = u32;
            fn read(f: &str, v: &Value, _: &mut FileCx) -> Result<u32> {
                u32::try_from(integer(f, v)?).map_err(|_| {
                    anyhow!(
                        concat!($field, " (--", $flag, ") {} must not be a negative number"),
                        v
                    )
                })
            }
            fn flag(name: &str, vals: &[String]) -> Result<u32> {
                let n = Int::<i64>::flag(name, vals)?;
                u32::try_from(n).map_err(|_| {
                    anyhow!(
                        concat!($field, " (--", $flag, ") {} must not be a negative number"),
                        n
                    )
                })
            }
            fn arg(a: Arg) -> Arg {
                Int::<i64>::arg(a)
            }
            fn show(t: &u32) -> Value {
                (*t).into()
            }
        }
    };
}
non_negative_codec!(RegistryQps, "registryPullQPS", "registry-qps");
non_negative_codec!(RegistryBurst, "registryBurst", "registry-burst");

/// maxParallelImagePulls: unset (`null`) for no limit.
pub struct MaxParallel;
impl Codec for MaxParallel {
    const VALUE_NAME: &'static str = "N";
    type T = Option<u32>;
    fn read(f: &str, v: &Value, _: &mut FileCx) -> Result<Option<u32>> {
        match v {
            Value::Null => Ok(None),
            _ => Ok(Some(
                integer(f, v)?
                    .try_into()
                    .map_err(|_| anyhow!("{f}: must be a positive number"))?,
            )),
        }
    }
    fn flag(name: &str, vals: &[String]) -> Result<Option<u32>> {
        let n = Int::<i64>::flag(name, vals)?;
        Ok(Some(u32::try_from(n).map_err(|_| {
            anyhow!("maxParallelImagePulls {n} must be a positive number")
        })?))
    }
    fn arg(a: Arg) -> Arg {
        Int::<i64>::arg(a)
    }
    fn show(t: &Option<u32>) -> Value {
        (*t).into()
    }
}

/// A string as given.
pub struct Str;
impl Codec for Str {
    const VALUE_NAME: &'static str = "STRING";
    type T = String;
    fn read(f: &str, v: &Value, _: &mut FileCx) -> Result<String> {
        string(f, v)
    }
    fn flag(_: &str, vals: &[String]) -> Result<String> {
        Ok(last(vals).to_string())
    }
    fn show(t: &String) -> Value {
        t.as_str().into()
    }
}

/// An optional string: empty in the file is unset.
pub struct OptStr;
impl Codec for OptStr {
    const VALUE_NAME: &'static str = "STRING";
    type T = Option<String>;
    fn read(f: &str, v: &Value, _: &mut FileCx) -> Result<Option<String>> {
        Ok(Some(string(f, v)?).filter(|s| !s.is_empty()))
    }
    fn flag(_: &str, vals: &[String]) -> Result<Option<String>> {
        Ok(Some(last(vals).to_string()))
    }
    fn show(t: &Option<String>) -> Value {
        t.clone().into()
    }
}

/// The node's name (`--hostname-override`), lowercased as kubelet does.
pub struct NodeName;
impl Codec for NodeName {
    const VALUE_NAME: &'static str = "NAME";
    type T = String;
    fn flag(_: &str, vals: &[String]) -> Result<String> {
        Ok(last(vals).trim().to_ascii_lowercase())
    }
}

/// A path: relative to the file's directory in the file, to the working directory on the
/// command line.
pub struct FilePath;
impl Codec for FilePath {
    const VALUE_NAME: &'static str = "PATH";
    type T = PathBuf;
    fn read(f: &str, v: &Value, cx: &mut FileCx) -> Result<PathBuf> {
        Ok(resolve_relative(cx.base, &string(f, v)?))
    }
    fn flag(_: &str, vals: &[String]) -> Result<PathBuf> {
        absolute(Path::new(last(vals)))
    }
    fn show(t: &PathBuf) -> Value {
        path(t)
    }
}

/// An optional path, set when given.
pub struct OptPath;
impl Codec for OptPath {
    const VALUE_NAME: &'static str = "PATH";
    type T = Option<PathBuf>;
    fn read(f: &str, v: &Value, cx: &mut FileCx) -> Result<Option<PathBuf>> {
        FilePath::read(f, v, cx).map(Some)
    }
    fn flag(name: &str, vals: &[String]) -> Result<Option<PathBuf>> {
        FilePath::flag(name, vals).map(Some)
    }
    fn show(t: &Option<PathBuf>) -> Value {
        t.as_deref().map_or(Value::Null, path)
    }
}

/// An optional path that an empty string in the file unsets (kubelet's TLS and CA files).
pub struct OptPathNonEmpty;
impl Codec for OptPathNonEmpty {
    const VALUE_NAME: &'static str = "PATH";
    type T = Option<PathBuf>;
    fn read(f: &str, v: &Value, cx: &mut FileCx) -> Result<Option<PathBuf>> {
        Ok(Some(string(f, v)?)
            .filter(|s| !s.is_empty())
            .map(|p| resolve_relative(cx.base, &p)))
    }
    fn flag(name: &str, vals: &[String]) -> Result<Option<PathBuf>> {
        OptPath::flag(name, vals)
    }
    fn show(t: &Option<PathBuf>) -> Value {
        OptPath::show(t)
    }
}

/// A list of paths (comma-separated on the command line).
pub struct PathList;
impl Codec for PathList {
    const VALUE_NAME: &'static str = "PATH,...";
    type T = Vec<PathBuf>;
    fn read(f: &str, v: &Value, cx: &mut FileCx) -> Result<Vec<PathBuf>> {
        list(f, v, "a list of paths")?
            .iter()
            .map(|p| string(f, p).map(|s| resolve_relative(cx.base, &s)))
            .collect()
    }
    fn flag(_: &str, vals: &[String]) -> Result<Vec<PathBuf>> {
        vals.iter().map(|p| absolute(Path::new(p))).collect()
    }
    fn arg(a: Arg) -> Arg {
        a.action(ArgAction::Append).value_delimiter(',')
    }
    fn show(t: &Vec<PathBuf>) -> Value {
        t.iter().map(|p| path(p)).collect()
    }
}

/// An IP address.
pub struct Ip;
impl Codec for Ip {
    const VALUE_NAME: &'static str = "IP";
    type T = IpAddr;
    fn read(f: &str, v: &Value, _: &mut FileCx) -> Result<IpAddr> {
        ip(f, v)
    }
    fn flag(name: &str, vals: &[String]) -> Result<IpAddr> {
        last(vals).parse().map_err(|e| anyhow!("--{name}: {e}"))
    }
    fn arg(a: Arg) -> Arg {
        a.action(ArgAction::Set).value_parser(value_parser!(IpAddr))
    }
    fn show(t: &IpAddr) -> Value {
        t.to_string().into()
    }
}

/// An optional IP address, set when given.
pub struct OptIp;
impl Codec for OptIp {
    const VALUE_NAME: &'static str = "IP";
    type T = Option<IpAddr>;
    fn read(f: &str, v: &Value, cx: &mut FileCx) -> Result<Option<IpAddr>> {
        Ip::read(f, v, cx).map(Some)
    }
    fn flag(name: &str, vals: &[String]) -> Result<Option<IpAddr>> {
        Ip::flag(name, vals).map(Some)
    }
    fn arg(a: Arg) -> Arg {
        Ip::arg(a)
    }
    fn show(t: &Option<IpAddr>) -> Value {
        t.map_or(Value::Null, |i| i.to_string().into())
    }
}

/// A list of IP addresses (comma-separated on the command line).
pub struct IpList;
impl Codec for IpList {
    const VALUE_NAME: &'static str = "IP,...";
    type T = Vec<IpAddr>;
    fn read(f: &str, v: &Value, _: &mut FileCx) -> Result<Vec<IpAddr>> {
        list(f, v, "a list of IP addresses")?.iter().map(|x| ip(f, x)).collect()
    }
    fn flag(name: &str, vals: &[String]) -> Result<Vec<IpAddr>> {
        vals.iter()
            .map(|s| s.parse().map_err(|e| anyhow!("--{name}: {e}")))
            .collect()
    }
    fn arg(a: Arg) -> Arg {
        a.action(ArgAction::Append)
            .value_delimiter(',')
            .value_parser(value_parser!(IpAddr))
    }
    fn show(t: &Vec<IpAddr>) -> Value {
        t.iter().map(|i| Value::from(i.to_string())).collect()
    }
}

/// allowedUnsafeSysctls: names or patterns (comma-separated on the command line).
pub struct Sysctls;
impl Codec for Sysctls {
    const VALUE_NAME: &'static str = "NAME,...";
    type T = Vec<String>;
    fn read(f: &str, v: &Value, _: &mut FileCx) -> Result<Vec<String>> {
        list(f, v, "a list of sysctl names or patterns")?
            .iter()
            .map(|x| string(f, x))
            .collect()
    }
    fn flag(_: &str, vals: &[String]) -> Result<Vec<String>> {
        Ok(vals.to_vec())
    }
    fn arg(a: Arg) -> Arg {
        a.action(ArgAction::Append).value_delimiter(',')
    }
    fn show(t: &Vec<String>) -> Value {
        t.clone().into()
    }
}

/// A quantity of bytes (`10Mi`); `/configz` writes the number of bytes as a string.
pub struct Quantity;
impl Codec for Quantity {
    const VALUE_NAME: &'static str = "QUANTITY";
    type T = u64;
    fn read(f: &str, v: &Value, _: &mut FileCx) -> Result<u64> {
        Ok(bytes(&string(f, v)?).map_err(|e| anyhow!("{f}: {e}"))? as u64)
    }
    fn flag(name: &str, vals: &[String]) -> Result<u64> {
        Ok(bytes(last(vals)).map_err(|e| anyhow!("--{name}: {e}"))? as u64)
    }
    fn show(t: &u64) -> Value {
        t.to_string().into()
    }
}

/// staticPodURLHeader (a map of header name to values) and `--manifest-url-header key:value`
/// (repeatable).
pub struct UrlHeaders;
impl Codec for UrlHeaders {
    const VALUE_NAME: &'static str = "KEY:VALUE";
    type T = Vec<(String, String)>;
    fn read(f: &str, v: &Value, _: &mut FileCx) -> Result<Vec<(String, String)>> {
        let mut out = Vec::new();
        for (k, vals) in object(f, v, "a map of header name to list of values")? {
            for x in list(&format!("{f}.{k}"), vals, "a list of strings")? {
                out.push((k.clone(), string(&format!("{f}.{k}"), x)?));
            }
        }
        Ok(out)
    }
    fn flag(_: &str, vals: &[String]) -> Result<Vec<(String, String)>> {
        vals.iter().map(|h| super::parse_header(h)).collect()
    }
    fn arg(a: Arg) -> Arg {
        a.action(ArgAction::Append)
    }
    fn show(t: &Vec<(String, String)>) -> Value {
        let mut m = Map::new();
        for (k, v) in t {
            if let Value::Array(a) = m.entry(k.clone()).or_insert_with(|| Value::Array(Vec::new())) {
                a.push(v.as_str().into());
            }
        }
        Value::Object(m)
    }
}

/// registerWithTaints (Taint objects) and `--register-with-taints key=value:Effect,...`.
pub struct Taints;
impl Codec for Taints {
    const VALUE_NAME: &'static str = "KEY=VALUE:EFFECT,...";
    type T = Vec<k8s_openapi::api::core::v1::Taint>;
    fn read(f: &str, v: &Value, _: &mut FileCx) -> Result<Self::T> {
        list(f, v, "a list of taints")?
            .iter()
            .enumerate()
            .map(|(i, t)| ferrolet_fsutil::json::decode_value(t).map_err(|e| anyhow!("{f}[{i}]: {e}")))
            .collect()
    }
    fn flag(_: &str, vals: &[String]) -> Result<Self::T> {
        vals.iter().map(|t| super::parse_taint(t)).collect()
    }
    fn arg(a: Arg) -> Arg {
        a.action(ArgAction::Append).value_delimiter(',')
    }
    fn show(t: &Self::T) -> Value {
        serde_json::to_value(t).unwrap_or_default()
    }
}

/// `--node-labels key=value,...`.
pub struct Labels;
impl Codec for Labels {
    const VALUE_NAME: &'static str = "KEY=VALUE,...";
    type T = BTreeMap<String, String>;
    fn flag(_: &str, vals: &[String]) -> Result<Self::T> {
        vals.iter().map(|l| super::parse_label(l)).collect()
    }
    fn arg(a: Arg) -> Arg {
        a.action(ArgAction::Append).value_delimiter(',')
    }
}

/// A systemReserved / kubeReserved map: cpu, memory, ephemeral-storage and pid are reserved;
/// other resources are accepted with a warning.
pub struct ReservedMap;
impl Codec for ReservedMap {
    const VALUE_NAME: &'static str = "RESOURCE=QUANTITY,...";
    type T = Reserved;
    fn read(f: &str, v: &Value, cx: &mut FileCx) -> Result<Reserved> {
        let mut r = Reserved::default();
        for (res, q) in object(f, v, "a map of resource to quantity")? {
            let field = format!("{f}.{res}");
            let q = string(&field, q)?;
            let amount = match res.as_str() {
                "cpu" => crate::pod::units::milli(&q).map_err(|e| anyhow!("{field}: {e}"))?,
                "memory" | "ephemeral-storage" => bytes(&q).map_err(|e| anyhow!("{field}: {e}"))?,
                "pid" => q
                    .parse::<i64>()
                    .map_err(|_| anyhow!("{field}: {q:?} is not a number of process ids"))?,
                other => {
                    cx.warnings.push(format!("{f}.{other} is not enforced by ferrolet"));
                    continue;
                }
            };
            if amount < 0 {
                bail!("{field}: {q:?} is negative");
            }
            match res.as_str() {
                "cpu" => r.cpu_milli = amount,
                "memory" => r.memory = amount,
                "pid" => r.pid = amount,
                _ => r.ephemeral_storage = amount,
            }
        }
        Ok(r)
    }
    fn show(r: &Reserved) -> Value {
        let mut m = Map::new();
        if r.cpu_milli != 0 {
            m.insert("cpu".into(), format!("{}m", r.cpu_milli).into());
        }
        if r.memory != 0 {
            m.insert("memory".into(), r.memory.to_string().into());
        }
        if r.ephemeral_storage != 0 {
            m.insert("ephemeral-storage".into(), r.ephemeral_storage.to_string().into());
        }
        if r.pid != 0 {
            m.insert("pid".into(), r.pid.to_string().into());
        }
        Value::Object(m)
    }
}

/// qosReserved: `{memory: 50%}` in the file, `memory=50%` on the command line.
pub struct QosReserved;
impl Codec for QosReserved {
    const VALUE_NAME: &'static str = "memory=PERCENT";
    type T = Option<i64>;
    fn read(f: &str, v: &Value, _: &mut FileCx) -> Result<Option<i64>> {
        let mut out = None;
        for (res, x) in object(f, v, "a map of resource to percentage")? {
            let pct = string(&format!("{f}.{res}"), x)?;
            out = Some(super::qos_reserved_percent(f, res, &pct)?);
        }
        Ok(out)
    }
    fn flag(name: &str, vals: &[String]) -> Result<Option<i64>> {
        let mut out = None;
        for part in last(vals).split(',').filter(|p| !p.is_empty()) {
            let (res, v) = part
                .split_once('=')
                .ok_or_else(|| anyhow!("--{name}: {part:?} is not resource=percentage"))?;
            out = Some(super::qos_reserved_percent(&format!("--{name}"), res, v)?);
        }
        Ok(out)
    }
    fn show(t: &Option<i64>) -> Value {
        let mut m = Map::new();
        if let Some(p) = t {
            m.insert("memory".into(), format!("{p}%").into());
        }
        Value::Object(m)
    }
}

/// enforceNodeAllocatable: a list in the file, comma-separated on the command line; `none`
/// alone is the empty list, shown as `[none]`.
pub struct Enforce;
impl Codec for Enforce {
    const VALUE_NAME: &'static str = "LIST";
    type T = Vec<String>;
    fn read(f: &str, v: &Value, _: &mut FileCx) -> Result<Vec<String>> {
        let keys = list(f, v, "a list of strings")?
            .iter()
            .map(|x| string(f, x))
            .collect::<Result<Vec<_>>>()?;
        super::enforce_node_allocatable_list("enforceNodeAllocatable (--enforce-node-allocatable)", keys)
    }
    fn flag(name: &str, vals: &[String]) -> Result<Vec<String>> {
        let keys = last(vals)
            .split(',')
            .filter(|k| !k.is_empty())
            .map(str::to_string)
            .collect();
        super::enforce_node_allocatable_list(&format!("--{name}"), keys)
    }
    fn show(t: &Vec<String>) -> Value {
        if t.is_empty() {
            vec!["none"].into()
        } else {
            t.clone().into()
        }
    }
}

fn threshold(t: Threshold) -> Value {
    match t {
        Threshold::Quantity(q) => q.to_string().into(),
        Threshold::Percent(p) => format!("{p}%").into(),
    }
}

/// evictionHard / evictionSoft: a map of signal to threshold in the file,
/// `signal<threshold,...` on the command line.
pub struct Thresholds;
impl Codec for Thresholds {
    const VALUE_NAME: &'static str = "SIGNAL<QUANTITY,...";
    type T = EvictionHard;
    fn read(f: &str, v: &Value, cx: &mut FileCx) -> Result<EvictionHard> {
        let mut g = EvictionHard::none();
        for (signal, x) in object(f, v, "a map of signal to threshold")? {
            let field = format!("{f}.{signal}");
            let t = Threshold::parse(&string(&field, x)?).map_err(|e| anyhow!("{field}: {e:#}"))?;
            if !g.set(signal, Some(t)) {
                match signal.as_str() {
                    "allocatableMemory.available" => cx.warnings.push(format!(
                        "{field} is ignored: a hard memory.available threshold holds for it when enforceNodeAllocatable has pods"
                    )),
                    other => bail!("{f}: unsupported eviction signal {other:?}"),
                }
            }
        }
        Ok(g)
    }
    fn flag(name: &str, vals: &[String]) -> Result<EvictionHard> {
        let mut out = EvictionHard::none();
        for part in last(vals).split(',').map(str::trim).filter(|p| !p.is_empty()) {
            let (signal, t) = part
                .split_once('<')
                .ok_or_else(|| anyhow!("--{name}: {part:?} is not signal<threshold"))?;
            let t = Threshold::parse(t).map_err(|e| anyhow!("--{name}: {signal}: {e:#}"))?;
            if !out.set(signal.trim(), Some(t)) {
                bail!("--{name}: unsupported eviction signal {:?}", signal.trim());
            }
        }
        Ok(out)
    }
    fn show(t: &EvictionHard) -> Value {
        Value::Object(
            t.iter()
                .into_iter()
                .map(|(s, t)| (s.to_string(), threshold(t)))
                .collect(),
        )
    }
}

/// A map of eviction signal to a value in the file.
fn signal_map<T>(f: &str, v: &Value, parse: impl Fn(&str, &Value) -> Result<T>) -> Result<BTreeMap<String, T>> {
    let mut out = BTreeMap::new();
    for (signal, x) in object(f, v, "a map of eviction signal to value")? {
        if !EVICTION_SIGNALS.contains(&signal.as_str()) {
            bail!("{f}: unsupported eviction signal {signal:?}");
        }
        out.insert(signal.clone(), parse(&format!("{f}.{signal}"), x)?);
    }
    Ok(out)
}

/// kubelet's `signal=value,...` maps on the command line.
fn signal_flag<T>(name: &str, v: &str, parse: impl Fn(&str) -> Result<T>) -> Result<BTreeMap<String, T>> {
    let mut out = BTreeMap::new();
    for part in v.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let (signal, x) = part
            .split_once('=')
            .ok_or_else(|| anyhow!("--{name}: {part:?} is not signal=value"))?;
        let signal = signal.trim();
        if !EVICTION_SIGNALS.contains(&signal) {
            bail!("--{name}: unsupported eviction signal {signal:?}");
        }
        let x = parse(x.trim()).map_err(|e| anyhow!("--{name}: {signal}: {e:#}"))?;
        out.insert(signal.to_string(), x);
    }
    Ok(out)
}

/// evictionSoftGracePeriod: signal to duration.
pub struct GraceMap;
impl Codec for GraceMap {
    const VALUE_NAME: &'static str = "SIGNAL=DURATION,...";
    type T = BTreeMap<String, Duration>;
    fn read(f: &str, v: &Value, _: &mut FileCx) -> Result<Self::T> {
        signal_map(f, v, duration)
    }
    fn flag(name: &str, vals: &[String]) -> Result<Self::T> {
        signal_flag(name, last(vals), |v| parse_duration(v).map_err(|e| anyhow!("{e}")))
    }
    fn show(t: &Self::T) -> Value {
        Value::Object(t.iter().map(|(s, d)| (s.clone(), format_duration(*d).into())).collect())
    }
}

/// evictionMinimumReclaim: signal to quantity or percentage.
pub struct ReclaimMap;
impl Codec for ReclaimMap {
    const VALUE_NAME: &'static str = "SIGNAL=QUANTITY,...";
    type T = BTreeMap<String, Threshold>;
    fn read(f: &str, v: &Value, _: &mut FileCx) -> Result<Self::T> {
        signal_map(f, v, |field, x| {
            Threshold::parse(&string(field, x)?).map_err(|e| anyhow!("{field}: {e:#}"))
        })
    }
    fn flag(name: &str, vals: &[String]) -> Result<Self::T> {
        signal_flag(name, last(vals), Threshold::parse)
    }
    fn show(t: &Self::T) -> Value {
        Value::Object(t.iter().map(|(s, x)| (s.clone(), threshold(*x))).collect())
    }
}

/// ferrolet.network / `--network`: bridge, cni or none.
pub struct NetMode;
impl NetMode {
    fn parse(f: &str, s: &str) -> Result<NetworkMode> {
        Ok(match s {
            "bridge" => NetworkMode::Bridge,
            "cni" => NetworkMode::Cni,
            "none" => NetworkMode::None,
            other => bail!("{f}: expected bridge, cni or none, got {other:?}"),
        })
    }
}
impl Codec for NetMode {
    const VALUE_NAME: &'static str = "MODE";
    type T = NetworkMode;
    fn read(f: &str, v: &Value, _: &mut FileCx) -> Result<NetworkMode> {
        NetMode::parse(f, &string(f, v)?)
    }
    fn flag(name: &str, vals: &[String]) -> Result<NetworkMode> {
        NetMode::parse(&format!("--{name}"), last(vals))
    }
    fn show(t: &NetworkMode) -> Value {
        match t {
            NetworkMode::Bridge => "bridge",
            NetworkMode::Cni => "cni",
            NetworkMode::None => "none",
        }
        .into()
    }
}
