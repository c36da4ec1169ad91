//! The status page (`/ui`): the node, its pods and containers, recent events and an hour of
//! cpu and memory as inline SVG charts, rendered on the server as one HTML document with
//! inline CSS and no external assets (nodes are often air-gapped). The tables need no
//! JavaScript; `/ui/live.js`, the one script, replaces the page's `<main>` with a fresh copy
//! every few seconds. Every string that comes from a pod, an image or an event is escaped
//! ([`esc`]), and a Content-Security-Policy allows no script but that file. docs/status-page.md.

use std::fmt::Write as _;
use std::sync::Arc;

use axum::extract::State as AxumState;
use axum::http::header;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use chrono::{DateTime, Utc};
use k8s_openapi::api::core::v1::{ContainerStatus, Node, PodStatus};

use super::State;
use crate::events::{Kind, Recent};
use crate::pod::units::human_duration;
use crate::stats::history::{Point, Series, NONE, WINDOW_SECS};

/// How often the page's script fetches a fresh copy.
pub const REFRESH_SECS: u32 = 5;

/// The page's routes: `/ui` and its script.
pub fn routes() -> Router<Arc<State>> {
    Router::new()
        .route("/ui", get(page))
        .route("/ui/", get(page))
        .route("/ui/live.js", get(script))
}

/// Only the page's own script runs; styles and SVG are inline; requests go to the page only.
const CSP: &str = "default-src 'none'; script-src 'self'; style-src 'unsafe-inline'; img-src data:; \
                   connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'";

async fn page(AxumState(st): AxumState<Arc<State>>) -> Response {
    let node = super::node_object(&st).await;
    let view = View {
        node_name: &st.node_name,
        node: &node,
        pods: st.pods.entries(),
        events: st.events.recent(),
        now: Utc::now(),
    };
    let now = view.now.timestamp().clamp(0, u32::MAX as i64) as u32;
    // The points are copied out under the lock; the page is rendered without it.
    let (node_series, mut pods) = st.stats.with_history(|h| {
        let pods: Vec<PodCharts> = h
            .pods
            .values()
            .map(|p| PodCharts {
                full: format!("{}/{}", p.namespace, p.name),
                points: series_points(&p.series, now),
            })
            .collect();
        (series_points(&h.node, now), pods)
    });
    pods.sort_by(|a, b| a.full.cmp(&b.full));
    let html = render(&view, &node_series, &pods, now);
    (
        [
            (header::CONTENT_TYPE, "text/html; charset=utf-8"),
            (header::CACHE_CONTROL, "no-store"),
            (header::CONTENT_SECURITY_POLICY, CSP),
            (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
        ],
        html,
    )
        .into_response()
}

async fn script() -> Response {
    (
        [
            (header::CONTENT_TYPE, "text/javascript; charset=utf-8"),
            (header::CACHE_CONTROL, "no-cache"),
            (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
        ],
        LIVE_JS,
    )
        .into_response()
}

/// Fetch the page again every few seconds and swap its `<main>` in; say when it last did.
const LIVE_JS: &str = r#""use strict";
(function () {
  var body = document.body;
  body.setAttribute("data-live", "on");
  var every = Number(body.getAttribute("data-refresh") || "5") * 1000;
  function stamp(text) {
    var s = document.getElementById("updated");
    if (s) { s.textContent = text; }
  }
  function refresh() {
    fetch(location.pathname, { cache: "no-store" })
      .then(function (r) { if (!r.ok) { throw new Error("HTTP " + r.status); } return r.text(); })
      .then(function (html) {
        var doc = new DOMParser().parseFromString(html, "text/html");
        var fresh = doc.querySelector("main");
        var old = document.querySelector("main");
        if (fresh && old) { old.replaceWith(document.importNode(fresh, true)); }
        body.setAttribute("data-refreshes", String(Number(body.getAttribute("data-refreshes") || "0") + 1));
        stamp("live, updated " + new Date().toLocaleTimeString());
      })
      .catch(function (e) { stamp("live, last update failed: " + e.message); });
  }
  stamp("live, every " + every / 1000 + " s");
  setInterval(refresh, every);
})();
"#;

struct View<'a> {
    node_name: &'a str,
    node: &'a Node,
    pods: Vec<crate::pod::manager::PodEntry>,
    events: Vec<Recent>,
    now: DateTime<Utc>,
}

/// One series as the charts take it: (time, cpu millicores, memory KiB), the last hour.
type Points = Vec<Point>;

struct PodCharts {
    full: String,
    points: Points,
}

fn series_points(s: &Series, now: u32) -> Points {
    s.last_hour(now).collect()
}

/// HTML-escape `s` for text and quoted attribute values.
pub fn esc(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

/// Millicores as `kubectl top` writes cpu: `250m`, `1.50` cores from a thousand up.
fn cpu_text(milli: u64) -> String {
    if milli >= 1000 {
        format!("{:.2}", milli as f64 / 1000.0)
    } else {
        format!("{milli}m")
    }
}

/// KiB as Ki, Mi or Gi with one decimal.
fn mem_text(kib: u64) -> String {
    match kib {
        k if k >= 1 << 20 => format!("{:.1}Gi", k as f64 / (1u64 << 20) as f64),
        k if k >= 1 << 10 => format!("{:.1}Mi", k as f64 / 1024.0),
        k => format!("{k}Ki"),
    }
}

/// A quantity in Ki (memory, storage) in the largest unit that keeps it readable; others as
/// they are.
fn quantity_text(q: &str) -> String {
    match q.strip_suffix("Ki").and_then(|n| n.parse::<u64>().ok()) {
        Some(kib) => mem_text(kib),
        None => q.to_string(),
    }
}

/// A round ceiling for a chart's scale: 1, 2 or 5 times a power of ten at or above `v`.
fn nice_ceiling(v: u64) -> u64 {
    let mut p = 1u64;
    loop {
        for m in [1, 2, 5] {
            if p.saturating_mul(m) >= v {
                return p.saturating_mul(m);
            }
        }
        p = p.saturating_mul(10);
    }
}

/// How long ago `t` was, as kubectl shows ages (`45s`, `2m30s`, `3h1m`).
fn age(now: DateTime<Utc>, t: DateTime<Utc>) -> String {
    human_duration((now - t).num_seconds())
}

fn k8s_time(t: &k8s_openapi::apimachinery::pkg::apis::meta::v1::Time) -> Option<DateTime<Utc>> {
    DateTime::from_timestamp(t.0.as_second(), t.0.subsec_nanosecond().max(0) as u32)
}

#[derive(Clone, Copy)]
enum Metric {
    Cpu,
    Memory,
}

impl Metric {
    fn value(self, p: &Point) -> u32 {
        match self {
            Metric::Cpu => p.cpu_milli,
            Metric::Memory => p.mem_kib,
        }
    }

    fn text(self, v: u64) -> String {
        match self {
            Metric::Cpu => cpu_text(v),
            Metric::Memory => mem_text(v),
        }
    }

    /// The smallest top of the scale: 10m of cpu, 1Mi of memory (an idle pod's line is
    /// not blown up to fill the chart).
    fn least_scale(self) -> u64 {
        match self {
            Metric::Cpu => 10,
            Metric::Memory => 1024,
        }
    }

    fn name(self) -> &'static str {
        match self {
            Metric::Cpu => "cpu",
            Metric::Memory => "memory",
        }
    }
}

/// An SVG line chart of `metric` over the last hour: one polyline vertex per point, a scale
/// from 0 to a round ceiling, labels for the scale and the hour.
fn chart(out: &mut String, points: &[Point], metric: Metric, now: u32, (w, h): (u32, u32), title: &str) {
    let (left, right, top, bottom) = (44.0, 6.0, 8.0, 16.0);
    let (pw, ph) = (w as f64 - left - right, h as f64 - top - bottom);
    let vals: Vec<(u32, u32)> = points
        .iter()
        .map(|p| (p.at, metric.value(p)))
        .filter(|(_, v)| *v != NONE)
        .collect();
    let max = vals.iter().map(|(_, v)| *v as u64).max().unwrap_or(0);
    let scale = nice_ceiling(max.max(metric.least_scale()));
    // The hour, or less while the agent is younger: from the first point (a minute at least).
    let span = vals
        .first()
        .map_or(WINDOW_SECS, |(at, _)| now.saturating_sub(*at).clamp(60, WINDOW_SECS));
    let from = now.saturating_sub(span);
    let latest = vals.last().map_or("-".to_string(), |(_, v)| metric.text(*v as u64));
    let _ = write!(
        out,
        r#"<figure class="chart"><figcaption>{} <b>{}</b></figcaption><svg viewBox="0 0 {w} {h}" width="{w}" height="{h}" role="img" aria-label="{} over the last hour" data-metric="{}" data-points="{}">"#,
        esc(title),
        esc(&latest),
        metric.name(),
        metric.name(),
        vals.len()
    );
    // grid and labels
    for (frac, label) in [
        (0.0, metric.text(0)),
        (0.5, metric.text(scale / 2)),
        (1.0, metric.text(scale)),
    ] {
        let label = if frac == 0.0 { "0".to_string() } else { label };
        let y = top + ph * (1.0 - frac);
        let _ = write!(
            out,
            r#"<line class="grid" x1="{left}" x2="{:.1}" y1="{y:.1}" y2="{y:.1}"/><text class="ylabel" x="{:.1}" y="{:.1}">{}</text>"#,
            left + pw,
            left - 4.0,
            y + 3.5,
            esc(&label)
        );
    }
    for (frac, label) in [
        (0.0, format!("-{}", human_duration(i64::from(span)))),
        (0.5, format!("-{}", human_duration(i64::from(span / 2)))),
        (1.0, "now".to_string()),
    ] {
        let x = left + pw * frac;
        let anchor = if frac == 0.0 {
            "start"
        } else if frac == 1.0 {
            "end"
        } else {
            "middle"
        };
        let _ = write!(
            out,
            r#"<text class="xlabel" x="{x:.1}" y="{:.1}" text-anchor="{anchor}">{label}</text>"#,
            h as f64 - 3.0
        );
    }
    let xy = |(at, v): (u32, u32)| {
        let x = left + pw * (at.saturating_sub(from) as f64 / span as f64).min(1.0);
        let y = top + ph * (1.0 - v as f64 / scale as f64);
        (x, y)
    };
    if !vals.is_empty() {
        let coords: Vec<String> = vals
            .iter()
            .map(|p| {
                let (x, y) = xy(*p);
                format!("{x:.1},{y:.1}")
            })
            .collect();
        let (x0, _) = xy(vals[0]);
        let (x1, _) = xy(vals[vals.len() - 1]);
        let base = top + ph;
        let _ = write!(
            out,
            r#"<path class="area" d="M{x0:.1},{base:.1} L{} L{x1:.1},{base:.1} Z"/><polyline class="line" points="{}"/>"#,
            coords.join(" L"),
            coords.join(" ")
        );
    } else {
        let _ = write!(
            out,
            r#"<text class="empty" x="{:.1}" y="{:.1}" text-anchor="middle">no samples yet</text>"#,
            left + pw / 2.0,
            top + ph / 2.0
        );
    }
    out.push_str("</svg></figure>");
}

const STYLE: &str = r#"
:root{--bg:#f6f7f9;--card:#fff;--ink:#1d2430;--mute:#6a7382;--line:#e3e6eb;--accent:#2f6fde;--ok:#1f8a4c;--warn:#b7791f;--bad:#c53030}
*{box-sizing:border-box}
body{margin:0;font:14px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,"DejaVu Sans",sans-serif;background:var(--bg);color:var(--ink)}
header{background:#18202c;color:#fff;padding:12px 24px;display:flex;align-items:baseline;gap:16px;flex-wrap:wrap}
header h1{font-size:18px;margin:0}
header .sub{color:#b8c1cf}
header #updated{margin-left:auto;color:#b8c1cf;font-size:12px}
main{padding:16px 24px;display:grid;gap:16px}
section{background:var(--card);border:1px solid var(--line);border-radius:8px;padding:12px 16px;overflow-x:auto}
h2{font-size:15px;margin:0 0 8px}
table{border-collapse:collapse;width:100%}
th,td{text-align:left;padding:4px 8px;border-bottom:1px solid var(--line);vertical-align:top}
th{color:var(--mute);font-weight:600;font-size:12px;text-transform:uppercase;letter-spacing:.03em}
td.num{text-align:right;font-variant-numeric:tabular-nums}
code,.mono{font-family:ui-monospace,"DejaVu Sans Mono",monospace;font-size:12.5px}
.badge{display:inline-block;padding:0 7px;border-radius:10px;font-size:12px;font-weight:600;background:#edf0f4;color:var(--mute)}
.ok{background:#e3f4ea;color:var(--ok)}.warn{background:#fdf3e1;color:var(--warn)}.bad{background:#fde8e8;color:var(--bad)}
.grid2{display:grid;grid-template-columns:repeat(auto-fit,minmax(320px,1fr));gap:16px}
.charts{display:flex;gap:16px;flex-wrap:wrap}
figure.chart{margin:0}
figcaption{font-size:12px;color:var(--mute)}
figcaption b{color:var(--ink)}
svg .grid{stroke:var(--line);stroke-width:1}
svg .line{fill:none;stroke:var(--accent);stroke-width:1.5;stroke-linejoin:round}
svg[data-metric=memory] .line{stroke:#8a4fd3}
svg .area{fill:var(--accent);opacity:.12;stroke:none}
svg[data-metric=memory] .area{fill:#8a4fd3}
svg text{font-size:10px;fill:var(--mute)}
svg .ylabel{text-anchor:end}
.msg{color:var(--mute);max-width:48ch;overflow-wrap:anywhere}
.pressure{display:flex;gap:8px;flex-wrap:wrap;margin-bottom:8px}
"#;

fn badge(class: &str, text: &str) -> String {
    format!(r#"<span class="badge {class}">{}</span>"#, esc(text))
}

fn phase_class(phase: &str) -> &'static str {
    match phase {
        "Running" | "Succeeded" => "ok",
        "Pending" => "warn",
        "Failed" => "bad",
        _ => "",
    }
}

/// The page for `view`, with the charts' points.
fn render(view: &View<'_>, node_points: &[Point], pods: &[PodCharts], now: u32) -> String {
    let mut o = String::with_capacity(32 * 1024);
    let _ = write!(
        o,
        r#"<!DOCTYPE html><html lang="en"><head><meta charset="utf-8"><meta name="viewport" content="width=device-width,initial-scale=1"><title>ferrolet · {}</title><noscript><meta http-equiv="refresh" content="30"></noscript><style>{STYLE}</style></head><body data-refresh="{REFRESH_SECS}"><header><h1>ferrolet</h1><span class="sub">node <b>{}</b></span><span class="sub">{}</span><span id="updated">static page (reload for fresh numbers)</span></header><main>"#,
        esc(view.node_name),
        esc(view.node_name),
        esc(&view.now.format("%Y-%m-%d %H:%M:%S UTC").to_string()),
    );
    node_section(&mut o, view, node_points, now);
    pods_section(&mut o, view, pods, now);
    containers_section(&mut o, view);
    events_section(&mut o, view);
    o.push_str(r#"</main><script src="/ui/live.js" defer></script></body></html>"#);
    o
}

fn node_section(o: &mut String, view: &View<'_>, points: &[Point], now: u32) {
    let status = view.node.status.clone().unwrap_or_default();
    o.push_str(r#"<section id="node"><h2>Node</h2><div class="pressure">"#);
    let conditions = status.conditions.unwrap_or_default();
    for c in &conditions {
        let bad = if c.type_ == "Ready" {
            c.status != "True"
        } else {
            c.status == "True"
        };
        let class = if bad { "bad" } else { "ok" };
        let text = if c.type_ == "Ready" {
            if bad {
                "NotReady".to_string()
            } else {
                "Ready".to_string()
            }
        } else if bad {
            c.type_.clone()
        } else {
            format!("no {}", c.type_.trim_end_matches("Pressure").to_lowercase()) + " pressure"
        };
        o.push_str(&badge(class, &text));
    }
    o.push_str(r#"</div><div class="charts">"#);
    chart(o, points, Metric::Cpu, now, (420, 130), "cpu");
    chart(o, points, Metric::Memory, now, (420, 130), "memory (working set)");
    o.push_str(r#"</div><div class="grid2"><div><table id="resources"><thead><tr><th>resource</th><th>capacity</th><th>allocatable</th></tr></thead><tbody>"#);
    let capacity = status.capacity.unwrap_or_default();
    let allocatable = status.allocatable.unwrap_or_default();
    for (name, q) in &capacity {
        let a = allocatable.get(name).map_or("-", |q| q.0.as_str());
        let _ = write!(
            o,
            "<tr><td>{}</td><td class=\"mono\" title=\"{}\">{}</td><td class=\"mono\" title=\"{}\">{}</td></tr>",
            esc(name),
            esc(&q.0),
            esc(&quantity_text(&q.0)),
            esc(a),
            esc(&quantity_text(a))
        );
    }
    o.push_str(r#"</tbody></table></div><div><table id="conditions"><thead><tr><th>condition</th><th>status</th><th>reason</th><th>message</th></tr></thead><tbody>"#);
    for c in &conditions {
        let _ = write!(
            o,
            "<tr><td>{}</td><td>{}</td><td>{}</td><td class=\"msg\">{}</td></tr>",
            esc(&c.type_),
            esc(&c.status),
            esc(c.reason.as_deref().unwrap_or("")),
            esc(c.message.as_deref().unwrap_or(""))
        );
    }
    o.push_str("</tbody></table></div></div></section>");
}

fn statuses(s: &PodStatus) -> impl Iterator<Item = &ContainerStatus> {
    s.init_container_statuses
        .iter()
        .flatten()
        .chain(s.container_statuses.iter().flatten())
}

fn pods_section(o: &mut String, view: &View<'_>, charts: &[PodCharts], now: u32) {
    let _ = write!(
        o,
        r#"<section id="pods"><h2>Pods <span class="badge">{}</span></h2><table><thead><tr><th>namespace</th><th>pod</th><th>phase</th><th>ready</th><th>restarts</th><th>IP</th><th>age</th><th>cpu, last hour</th><th>memory, last hour</th></tr></thead><tbody>"#,
        view.pods.len()
    );
    let mut pods: Vec<_> = view.pods.iter().collect();
    pods.sort_by_key(|e| crate::pod::full_name(&e.pod));
    for e in pods {
        let (ns, name) = (
            e.pod.metadata.namespace.as_deref().unwrap_or("default"),
            e.pod.metadata.name.as_deref().unwrap_or(""),
        );
        let st = &e.status;
        let mut phase = st.phase.clone().unwrap_or_else(|| "Pending".into());
        if e.terminating {
            phase = "Terminating".into();
        }
        let app = st.container_statuses.as_deref().unwrap_or_default();
        let ready = app.iter().filter(|c| c.ready).count();
        let restarts: i32 = statuses(st).map(|c| c.restart_count).sum();
        let age_text = st
            .start_time
            .as_ref()
            .and_then(k8s_time)
            .map_or("-".into(), |t| age(view.now, t));
        let _ = write!(
            o,
            r#"<tr data-pod="{}"><td>{}</td><td><b>{}</b></td><td>{}</td><td class="num">{ready}/{}</td><td class="num restarts">{restarts}</td><td class="mono">{}</td><td>{}</td>"#,
            esc(&format!("{ns}/{name}")),
            esc(ns),
            esc(name),
            badge(phase_class(&phase), &phase),
            crate::pod::spec(&e.pod).containers.len(),
            esc(st.pod_ip.as_deref().unwrap_or("-")),
            age_text,
        );
        let full = format!("{ns}/{name}");
        match charts.iter().find(|c| c.full == full) {
            Some(c) => {
                o.push_str("<td>");
                chart(o, &c.points, Metric::Cpu, now, (220, 64), "");
                o.push_str("</td><td>");
                chart(o, &c.points, Metric::Memory, now, (220, 64), "");
                o.push_str("</td>");
            }
            None => o.push_str(r#"<td class="msg">no samples</td><td></td>"#),
        }
        o.push_str("</tr>");
    }
    o.push_str("</tbody></table></section>");
}

/// A container's state as `kubectl describe` would name it.
fn state_text(c: &ContainerStatus) -> (String, &'static str) {
    let Some(s) = &c.state else {
        return ("Unknown".into(), "");
    };
    if let Some(w) = &s.waiting {
        let r = w.reason.clone().unwrap_or_else(|| "Waiting".into());
        let class = if r == "ContainerCreating" || r == "PodInitializing" {
            "warn"
        } else {
            "bad"
        };
        return (r, class);
    }
    if let Some(t) = &s.terminated {
        let r = t.reason.clone().unwrap_or_else(|| "Terminated".into());
        return (
            format!("{r} ({})", t.exit_code),
            if t.exit_code == 0 { "" } else { "bad" },
        );
    }
    if s.running.is_some() {
        return ("Running".into(), "ok");
    }
    ("Unknown".into(), "")
}

fn containers_section(o: &mut String, view: &View<'_>) {
    o.push_str(r#"<section id="containers"><h2>Containers</h2><table><thead><tr><th>pod</th><th>container</th><th>image</th><th>state</th><th>ready</th><th>restarts</th><th>last termination</th></tr></thead><tbody>"#);
    let mut pods: Vec<_> = view.pods.iter().collect();
    pods.sort_by_key(|e| crate::pod::full_name(&e.pod));
    for e in pods {
        let pod = format!("{}/{}", crate::pod::namespace(&e.pod), crate::pod::name(&e.pod));
        for c in statuses(&e.status) {
            let (state, class) = state_text(c);
            let last = c.last_state.as_ref().and_then(|l| l.terminated.as_ref()).map(|t| {
                let mut s = format!("{} (exit {})", t.reason.as_deref().unwrap_or("Terminated"), t.exit_code);
                if let Some(at) = t.finished_at.as_ref().and_then(k8s_time) {
                    let _ = write!(s, ", {} ago", age(view.now, at));
                }
                (s, t.message.clone().unwrap_or_default())
            });
            let (last, message) = last.unwrap_or_else(|| ("-".into(), String::new()));
            let message: String = message.trim().chars().take(300).collect();
            let _ = write!(
                o,
                r#"<tr data-container="{}"><td>{}</td><td><b>{}</b></td><td class="mono">{}</td><td>{}</td><td>{}</td><td class="num restarts">{}</td><td>{}{}</td></tr>"#,
                esc(&format!("{pod}/{}", c.name)),
                esc(&pod),
                esc(&c.name),
                esc(&c.image),
                badge(class, &state),
                if c.ready {
                    badge("ok", "ready")
                } else {
                    badge("", "not ready")
                },
                c.restart_count,
                esc(&last),
                if message.is_empty() {
                    String::new()
                } else {
                    format!(r#"<div class="msg mono">{}</div>"#, esc(&message))
                }
            );
        }
    }
    o.push_str("</tbody></table></section>");
}

fn events_section(o: &mut String, view: &View<'_>) {
    let _ = write!(
        o,
        r#"<section id="events"><h2>Recent events <span class="badge">{}</span></h2><table><thead><tr><th>age</th><th>type</th><th>object</th><th>reason</th><th>message</th></tr></thead><tbody>"#,
        view.events.len()
    );
    if view.events.is_empty() {
        o.push_str(r#"<tr><td colspan="5" class="msg">none since the agent started</td></tr>"#);
    }
    for e in &view.events {
        let class = match e.kind {
            Kind::Normal => "",
            Kind::Warning => "warn",
        };
        let _ = write!(
            o,
            r#"<tr><td title="{}">{}</td><td>{}</td><td class="mono">{}</td><td>{}</td><td class="msg">{}</td></tr>"#,
            esc(&e.time.to_rfc3339()),
            age(view.now, e.time),
            badge(class, e.kind.as_str()),
            esc(&e.object),
            esc(&e.reason),
            esc(&e.message)
        );
    }
    o.push_str("</tbody></table></section>");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escaping() {
        assert_eq!(
            esc(r#"<script>alert("x&y")</script>'"#),
            "&lt;script&gt;alert(&quot;x&amp;y&quot;)&lt;/script&gt;&#39;"
        );
        assert_eq!(esc("plain-name_1.2"), "plain-name_1.2");
    }

    #[test]
    fn hostile_strings_stay_text() {
        let node = Node::default();
        let mut pod: k8s_openapi::api::core::v1::Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "p<img src=x onerror=alert(1)>", "namespace": "default"},
            "spec": {"containers": [{"name": "c", "image": "busybox\"><script>alert(2)</script>"}]},
        }))
        .unwrap();
        pod.status = None;
        let status: PodStatus = serde_json::from_value(serde_json::json!({
            "phase": "Running",
            "containerStatuses": [{
                "name": "c", "image": "busybox\"><script>alert(2)</script>", "imageID": "", "ready": false,
                "restartCount": 3,
                "lastState": {"terminated": {"exitCode": 1, "reason": "Error", "message": "<script>alert(3)</script>"}},
            }],
        }))
        .unwrap();
        let view = View {
            node_name: "n<1>",
            node: &node,
            pods: vec![crate::pod::manager::PodEntry {
                pod: Arc::new(pod),
                status: Arc::new(status),
                terminating: false,
            }],
            events: vec![Recent {
                time: Utc::now(),
                kind: Kind::Warning,
                object: "default/p".into(),
                reason: "BackOff".into(),
                message: "<script>alert(4)</script>".into(),
            }],
            now: Utc::now(),
        };
        let html = render(&view, &[], &[], 0);
        assert!(!html.contains("<script>alert"), "{html}");
        assert!(!html.contains("<img"), "{html}");
        for n in 2..=4 {
            assert!(
                html.contains(&format!("&lt;script&gt;alert({n})&lt;/script&gt;")),
                "{n}: {html}"
            );
        }
        assert!(html.contains("p&lt;img src=x onerror=alert(1)&gt;"));
        assert!(html.contains(r#"<td class="num restarts">3</td>"#));
        // the only script is the page's own file
        assert_eq!(html.matches("<script").count(), 1);
        assert!(html.contains(r#"<script src="/ui/live.js" defer></script>"#));
    }

    #[test]
    fn charts_have_a_vertex_per_point() {
        let pts: Vec<Point> = (0..10)
            .map(|i| Point {
                at: 10_000 + i * 10,
                cpu_milli: if i == 0 { NONE } else { i * 100 },
                mem_kib: 2048,
            })
            .collect();
        let mut o = String::new();
        chart(&mut o, &pts, Metric::Cpu, 10_100, (400, 100), "cpu");
        assert!(o.contains(r#"data-points="9""#), "{o}");
        let poly = o.split(r#"<polyline class="line" points=""#).nth(1).unwrap();
        let poly = &poly[..poly.find('"').unwrap()];
        assert_eq!(poly.split(' ').count(), 9);
        assert!(o.contains(">1.00<"), "scale ceiling 1000m: {o}");
        assert!(
            o.contains(">-90s<") && o.contains(">-45s<") && o.contains(">now<"),
            "{o}"
        );
        let mut o = String::new();
        chart(&mut o, &[], Metric::Memory, 10_090, (400, 100), "memory");
        assert!(o.contains("no samples yet") && o.contains(r#"data-points="0""#));
        assert!(o.contains(">-60m<"), "{o}");
    }

    #[test]
    fn numbers_as_people_read_them() {
        assert_eq!(cpu_text(250), "250m");
        assert_eq!(cpu_text(1500), "1.50");
        assert_eq!(mem_text(512), "512Ki");
        assert_eq!(mem_text(3 * 1024 + 512), "3.5Mi");
        assert_eq!(mem_text(2 << 20), "2.0Gi");
        assert_eq!(quantity_text("24684084Ki"), "23.5Gi");
        assert_eq!(quantity_text("110"), "110");
        assert_eq!(nice_ceiling(1), 1);
        assert_eq!(nice_ceiling(3), 5);
        assert_eq!(nice_ceiling(130), 200);
        assert_eq!(nice_ceiling(1000), 1000);
    }
}
