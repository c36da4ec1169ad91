//! Every setting of `ferrolet run` is declared once, on its field in the configuration's
//! structs ([`Config`] and the objects it holds), with [`declare!`]: the field's doc (also the
//! flag's help), its type and default, and a `#[setting(FIELD | FLAG => CODEC, OPTIONS)]` line
//! naming its KubeletConfiguration field (kubelet.config.k8s.io/v1beta1 name; `a.b` inside an
//! object, `ferrolet.x` for ferrolet's own), its flag (kubelet's name) and its [`Codec`] (how
//! the value is written in the file, on the command line and in `/configz`). The flag's help
//! is the field's doc, or a `#[help = "..."]` above the setting where the doc speaks to the
//! code's readers rather than to the flag's. The file reader
//! ([`super::file`]), the flags ([`super::flags`]) and `/configz` ([`super::effective`]) all
//! walk [`SETTINGS`], which the declarations make; checks across fields are
//! [`Config::validate`]. docs/config.md says how to add one.
//!
//! FIELD or FLAG may be `_` (no such form); OPTIONS are `quiet` (not shown in `/configz`) and
//! `hidden` (a flag kept out of `--help`). A field marked `#[nested(ITS TYPE)]` is an object
//! whose own settings are listed at its place.

use std::sync::{Arc, LazyLock};

use anyhow::Result;
use clap::Arg;
use serde_json::Value;

use super::codec::*;
use super::Config;

type Read<S> = Arc<dyn Fn(&mut S, &str, &Value, &mut FileCx) -> Result<()> + Send + Sync>;
type ApplyFlag<S> = Arc<dyn Fn(&mut S, &str, &[String]) -> Result<()> + Send + Sync>;
type Show<S> = Arc<dyn Fn(&S) -> Value + Send + Sync>;

/// One setting of the struct `S`, as [`declare!`] makes it.
pub struct Setting<S = Config> {
    /// The file's field, dotted inside objects (`authentication.webhook.cacheTTL`).
    pub json: Option<&'static str>,
    /// The flag's long name (a one-letter name is also the short flag: `-v`).
    pub flag: Option<&'static str>,
    /// The flag's help: the field's `#[help]`, else its doc.
    pub doc: &'static str,
    pub opts: &'static [&'static str],
    /// Set the setting from the file's value, naming the field in errors.
    pub read: Read<S>,
    /// Set the setting from the flag's values.
    pub apply_flag: ApplyFlag<S>,
    /// The value as `/configz` shows it.
    pub show: Show<S>,
    /// The flag's clap shape.
    pub arg: fn(Arg) -> Arg,
    /// What the flag's value is called in `--help`.
    pub value_name: &'static str,
}

impl<S: 'static> Setting<S> {
    /// The setting of the field `get` reaches, written with the codec `C`.
    pub fn new<C: Codec + 'static>(
        (json, flag, doc, opts): (
            Option<&'static str>,
            Option<&'static str>,
            &'static str,
            &'static [&'static str],
        ),
        get: fn(&S) -> &C::T,
        get_mut: fn(&mut S) -> &mut C::T,
    ) -> Setting<S> {
        Setting {
            json,
            flag,
            doc,
            opts,
            read: Arc::new(move |s, f, v, cx| {
                *get_mut(s) = C::read(f, v, cx)?;
                Ok(())
            }),
            apply_flag: Arc::new(move |s, name, vals| {
                *get_mut(s) = C::flag(name, vals)?;
                Ok(())
            }),
            show: Arc::new(move |s| C::show(get(s))),
            arg: C::arg,
            value_name: C::VALUE_NAME,
        }
    }

    /// This setting of an object that the struct `P` holds at `get`.
    pub fn within<P: 'static>(self, get: fn(&P) -> &S, get_mut: fn(&mut P) -> &mut S) -> Setting<P> {
        let (read, apply_flag, show) = (self.read, self.apply_flag, self.show);
        Setting {
            json: self.json,
            flag: self.flag,
            doc: self.doc,
            opts: self.opts,
            read: Arc::new(move |p, f, v, cx| read(get_mut(p), f, v, cx)),
            apply_flag: Arc::new(move |p, name, vals| apply_flag(get_mut(p), name, vals)),
            show: Arc::new(move |p| show(get(p))),
            arg: self.arg,
            value_name: self.value_name,
        }
    }

    pub fn has(&self, opt: &str) -> bool {
        self.opts.contains(&opt)
    }

    /// The flag's help on one line (without a final period, as clap's derive writes it).
    pub fn help(&self) -> String {
        let help = self.doc.split_whitespace().collect::<Vec<_>>().join(" ");
        help.strip_suffix('.').map(str::to_string).unwrap_or(help)
    }
}

macro_rules! name {
    (_) => {
        None
    };
    ($n:literal) => {
        Some($n)
    };
}
pub(super) use name;

/// A setting's help: its `#[help]` if it has one, else its doc.
macro_rules! help_or {
    ($help:literal ; $doc:expr) => {
        $help
    };
    (; $doc:expr) => {
        $doc
    };
}
pub(super) use help_or;

/// A configuration struct whose fields each have a default (`pub x: T = default,`), some of
/// them settings (`#[setting(...)]`) or objects of settings (`#[nested]`): the struct, its
/// `Default`, and `settings()`, its settings in field order.
macro_rules! declare {
    (
        $(#[$meta:meta])*
        pub struct $name:ident {
            $(
                $(#[doc = $doc:literal])*
                $(#[help = $help:literal])?
                $(#[setting($json:tt | $flag:tt => $codec:ty $(, $opt:ident)*)])?
                $(#[nested($sub:ty)])?
                pub $field:ident : $fty:ty = $default:expr,
            )*
        }
    ) => {
        $(#[$meta])*
        pub struct $name {
            $(
                $(#[doc = $doc])*
                pub $field: $fty,
            )*
        }

        impl Default for $name {
            fn default() -> Self {
                $name {
                    $($field: $default,)*
                }
            }
        }

        impl $name {
            /// Its settings, in the order of its fields (`--help` lists the flags so).
            pub fn settings() -> Vec<$crate::config::settings::Setting<$name>> {
                #[allow(unused_mut)]
                let mut all = Vec::new();
                $(
                    #[allow(unused_variables)]
                    let doc: &'static str = $crate::config::settings::help_or!($($help)? ; concat!($($doc, "\n",)*));
                    $(
                        all.push($crate::config::settings::Setting::new::<$codec>(
                            (
                                $crate::config::settings::name!($json),
                                $crate::config::settings::name!($flag),
                                doc,
                                &[$(stringify!($opt)),*],
                            ),
                            |c: &$name| &c.$field,
                            |c: &mut $name| &mut c.$field,
                        ));
                    )?
                    $(
                        all.extend(<$sub>::settings().into_iter().map(|s| {
                            s.within(|c: &$name| &c.$field, |c: &mut $name| &mut c.$field)
                        }));
                    )?
                )*
                all
            }
        }
    };
}
pub(super) use declare;

/// Every setting, in the order `--help` lists the flags.
pub static SETTINGS: LazyLock<Vec<Setting>> = LazyLock::new(Config::settings);

/// Top-level names the file also accepts for a `ferrolet.` setting (the contract of issue 14
/// names them so).
pub const ALIASES: &[(&str, &str)] = &[
    ("registryConfigFile", "ferrolet.registryConfigFile"),
    ("imagePullProgressTimeout", "ferrolet.imagePullProgressTimeout"),
];

/// The setting whose file field is `path`.
pub fn by_json(path: &str) -> Option<&'static Setting> {
    SETTINGS.iter().find(|s| s.json == Some(path))
}

/// Whether `path` is an object holding settings (`authentication`, `ferrolet`...).
pub fn is_object(path: &str) -> bool {
    SETTINGS
        .iter()
        .filter_map(|s| s.json)
        .any(|j| j.strip_prefix(path).is_some_and(|rest| rest.starts_with('.')))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_unique() {
        let mut json: Vec<_> = SETTINGS.iter().filter_map(|s| s.json).collect();
        let mut flags: Vec<_> = SETTINGS.iter().filter_map(|s| s.flag).collect();
        let (nj, nf) = (json.len(), flags.len());
        json.sort();
        json.dedup();
        flags.sort();
        flags.dedup();
        assert_eq!((json.len(), flags.len()), (nj, nf), "a field or flag declared twice");
        assert!(SETTINGS.iter().all(|s| s.json.is_some() || s.flag.is_some()));
        // A field is a value or an object of fields, never both (/configz nests by the dots).
        for j in json {
            assert!(!is_object(j), "{j} is a setting and an object of settings");
        }
    }
}
