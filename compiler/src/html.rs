//! `mmq report REPORT.json -o report.html`: the compile report as one self-contained page (inline
//! SVG and CSS, a few lines of script, nothing fetched): per-layer SQNR bars coloured by modality
//! with the precision each layer ended up in, the activation granularity per modality, symmetric
//! against asymmetric activation error per layer, and the alignment outputs' similarity error.

use std::fmt::Write as _;

use serde_json::Value;

/// Bar colours by modality.
fn colour(modality: &str) -> &'static str {
    match modality {
        "vision" => "#1f77b4",
        "text" => "#ff7f0e",
        "audio" => "#9467bd",
        "fusion" => "#2ca02c",
        _ => "#7f7f7f",
    }
}

fn esc(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c if c.is_control() => out.push('\u{fffd}'),
            c => out.push(c),
        }
    }
    out
}

fn num(v: &Value) -> Option<f64> {
    v.as_f64()
}

fn text<'a>(v: &'a Value, key: &str) -> &'a str {
    v.get(key).and_then(Value::as_str).unwrap_or("")
}

/// SQNR for drawing: identical layers (no SQNR) and very high ones are drawn at `cap`.
fn sqnr(v: &Value, cap: f64) -> f64 {
    num(v).map_or(cap, |x| x.min(cap)).max(0.0)
}

/// A bar: label, value, colour, tooltip, faded (drawn lighter).
type Bar<'a> = (String, f64, &'a str, String, bool);

/// A vertical bar chart; with few bars each is labelled underneath.
fn bars(title: &str, unit: &str, items: &[Bar<'_>]) -> String {
    let labelled = items.len() <= 24;
    let (w, h, left) = (960.0, 260.0, 48.0);
    let bottom = if labelled { 40.0 } else { 24.0 };
    let max = items.iter().map(|i| i.1).fold(1.0f64, f64::max) * 1.1;
    let step = (w - left) / items.len().max(1) as f64;
    let mut s = format!(
        "<figure><figcaption>{}</figcaption><svg class=\"chart\" viewBox=\"0 0 {w} {}\" \
         width=\"{w}\" height=\"{}\" role=\"img\" aria-label=\"{}\">",
        esc(title),
        h + bottom,
        h + bottom,
        esc(title)
    );
    for k in 0..=4 {
        let v = max * f64::from(k) / 4.0;
        let y = h - v / max * (h - 10.0);
        let _ = write!(
            s,
            "<line x1=\"{left}\" x2=\"{w}\" y1=\"{y:.1}\" y2=\"{y:.1}\" class=\"grid\"/>\
             <text x=\"{:.1}\" y=\"{:.1}\" class=\"tick\">{v:.0}</text>",
            left - 4.0,
            y + 4.0
        );
    }
    for (i, (label, value, fill, tip, faded)) in items.iter().enumerate() {
        let bh = value / max * (h - 10.0);
        let x = left + i as f64 * step + step * 0.1;
        let _ = write!(
            s,
            "<rect class=\"bar\" x=\"{x:.1}\" y=\"{:.1}\" width=\"{:.1}\" height=\"{bh:.1}\" \
             fill=\"{fill}\" fill-opacity=\"{}\"><title>{}: {value:.2} {unit}{}</title></rect>",
            h - bh,
            (step * 0.8).max(0.5),
            if *faded { "0.35" } else { "1" },
            esc(label),
            esc(tip)
        );
        if labelled {
            let short: String = label.chars().take(18).collect();
            let _ = write!(
                s,
                "<text x=\"{:.1}\" y=\"{:.1}\" class=\"label\">{}</text>",
                x + step * 0.4,
                h + 14.0,
                esc(&short)
            );
        }
    }
    let _ = write!(
        s,
        "<text x=\"{left}\" y=\"{:.1}\" class=\"axis\">{} ({unit})</text></svg></figure>",
        h + bottom - 6.0,
        esc(title)
    );
    s
}

fn legend(modalities: &[&str]) -> String {
    let mut s = String::from("<p class=\"legend\">");
    for m in modalities {
        let _ = write!(
            s,
            "<span><i style=\"background:{}\"></i>{}</span>",
            colour(m),
            esc(m)
        );
    }
    s.push_str("</p>");
    s
}

/// JSON that is not a compile report.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct NotAReport(pub String);

/// The page for a compile report (the JSON `--report` writes).
pub fn render(report: &Value) -> Result<String, NotAReport> {
    if !report.is_object() || report.get("passes").is_none() {
        return Err(NotAReport(
            "not a compile report (no \"passes\"): write one with mmq compile --report".into(),
        ));
    }
    let mut body = String::new();
    let _ = write!(
        body,
        "<h1>mmq compile report</h1><p>target <b>{}</b>, level <b>{}</b>, {} passes in {:.1} ms</p>",
        esc(text(report, "target")),
        esc(text(report, "level")),
        report["passes"].as_array().map_or(0, Vec::len),
        num(&report["total_ms"]).unwrap_or(0.0)
    );
    let acc = &report["accuracy"];
    if let Some(e) = acc.get("end_to_end").filter(|e| e.is_object()) {
        let _ = write!(
            body,
            "<p>end to end: <b>{}</b> cosine mean {:.6}, min {:.6}, SQNR {} dB over {} held-back sample(s)</p>",
            esc(text(e, "output")),
            num(&e["cosine_mean"]).unwrap_or(f64::NAN),
            num(&e["cosine_min"]).unwrap_or(f64::NAN),
            num(&e["sqnr_db"]).map_or("∞".to_owned(), |x| format!("{x:.2}")),
            e["samples"].as_u64().unwrap_or(0)
        );
    }

    // Per-layer SQNR, coloured by modality, quantized layers first in their order.
    let layers: Vec<&Value> = report["layers"]
        .as_array()
        .map(|v| v.iter().collect())
        .unwrap_or_default();
    if layers.is_empty() {
        body.push_str("<p class=\"note\">No per-layer figures: compile with <code>--report</code> and a quantization scheme.</p>");
    } else {
        let mut seen: Vec<&str> = Vec::new();
        let items: Vec<Bar<'_>> = layers
            .iter()
            .map(|l| {
                let m = text(l, "modality");
                if !seen.contains(&m) {
                    seen.push(m);
                }
                (
                    text(l, "name").to_owned(),
                    sqnr(&l["sqnr_db"], 120.0),
                    colour(m),
                    format!(" ({m}, {}, {})", text(l, "op"), text(l, "precision")),
                    text(l, "precision") == "float",
                )
            })
            .collect();
        body.push_str("<h2>Per-layer SQNR</h2>");
        body.push_str(&legend(&seen));
        body.push_str(
            "<p class=\"note\">Solid bars: layers computed in a quantized precision; faded: \
             layers left in float (they carry the error of the layers before them). Hover a \
             bar for its name, op and precision.</p>",
        );
        body.push_str(&bars(
            "SQNR of each layer against the float model",
            "dB",
            &items,
        ));
        body.push_str("<details><summary>Layers: modality, precision, SQNR, cosine</summary><table><tr><th>layer</th><th>op</th><th>modality</th><th>precision</th><th>SQNR dB</th><th>cosine</th></tr>");
        for l in &layers {
            let _ = write!(
                body,
                "<tr><td>{}</td><td>{}</td><td>{}</td><td class=\"p-{}\">{}</td><td>{}</td><td>{:.6}</td></tr>",
                esc(text(l, "name")),
                esc(text(l, "op")),
                esc(text(l, "modality")),
                esc(&text(l, "precision").replace(' ', "-")),
                esc(text(l, "precision")),
                num(&l["sqnr_db"]).map_or("∞".to_owned(), |x| format!("{x:.2}")),
                num(&l["cosine"]).unwrap_or(f64::NAN)
            );
        }
        body.push_str("</table></details>");
    }

    // Activation granularity and symmetry.
    for a in report["activations"].as_array().into_iter().flatten() {
        let graph = text(a, "graph");
        let _ = write!(
            body,
            "<h2>Activation granularity — graph {}</h2><p>INT8 activations quantized one scale \
             per tensor (symmetric, asymmetric) or per row (per token / per patch), weights per \
             channel; mean SQNR of each MatMul's output over {} sample(s).</p>",
            esc(graph),
            a["samples"].as_u64().unwrap_or(0)
        );
        let names = [
            "per-tensor symmetric",
            "per-tensor asymmetric",
            "per-token / per-patch",
        ];
        let mut items = Vec::new();
        let mut seen = Vec::new();
        for m in a["modalities"].as_array().into_iter().flatten() {
            let md = text(m, "modality");
            seen.push(md);
            for (k, n) in names.iter().enumerate() {
                items.push((
                    format!("{md} {n}"),
                    sqnr(&m["mean_sqnr_db"][k], 120.0),
                    colour(md),
                    format!(" over {} layers", m["layers"].as_u64().unwrap_or(0)),
                    false,
                ));
            }
        }
        body.push_str(&legend(&seen));
        body.push_str(&bars(
            "Mean SQNR per modality: per-tensor sym, per-tensor asym, per-row",
            "dB",
            &items,
        ));
        body.push_str("<table><tr><th>layer</th><th>modality</th><th>symmetric dB</th><th>asymmetric dB</th><th>asym − sym</th><th>per row dB</th></tr>");
        for l in a["layers"].as_array().into_iter().flatten() {
            let s = num(&l["per_tensor_symmetric"]["sqnr_db"]).unwrap_or(f64::NAN);
            let z = num(&l["per_tensor_asymmetric"]["sqnr_db"]).unwrap_or(f64::NAN);
            let r = num(&l["per_row"]["sqnr_db"]).unwrap_or(f64::NAN);
            let _ = write!(
                body,
                "<tr><td>{}</td><td>{}</td><td>{s:.2}</td><td>{z:.2}</td><td>{:+.2}</td><td>{r:.2} ({})</td></tr>",
                esc(text(l, "node")),
                esc(text(l, "modality")),
                z - s,
                esc(text(l, "per_row_name"))
            );
        }
        body.push_str("</table>");
    }

    let alignment = report["alignment"].as_array().cloned().unwrap_or_default();
    if !alignment.is_empty() {
        body.push_str("<h2>Alignment</h2><p>Similarity error Δs = s<sub>quant</sub> − s<sub>fp</sub> over held-back samples.</p><table><tr><th>similarity</th><th>values</th><th>mean Δs</th><th>mean |Δs|</th><th>max |Δs|</th><th>mean |s<sub>fp</sub>|</th></tr>");
        for a in &alignment {
            let _ = write!(
                body,
                "<tr><td>{}</td><td>{}</td><td>{:+.5}</td><td>{:.5}</td><td>{:.5}</td><td>{:.5}</td></tr>",
                esc(text(a, "what")),
                a["values"].as_u64().unwrap_or(0),
                num(&a["mean_delta"]).unwrap_or(f64::NAN),
                num(&a["mean_abs_delta"]).unwrap_or(f64::NAN),
                num(&a["max_abs_delta"]).unwrap_or(f64::NAN),
                num(&a["mean_abs_fp"]).unwrap_or(f64::NAN)
            );
        }
        body.push_str("</table>");
    }

    Ok(format!(
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\
         <meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\
         <title>mmq compile report</title><style>{STYLE}</style></head><body>{body}\
         <script>{SCRIPT}</script></body></html>\n"
    ))
}

const STYLE: &str = "body{font:14px/1.4 system-ui,sans-serif;margin:24px;color:#222}\
h2{margin-top:32px}table{border-collapse:collapse;margin:8px 0}\
td,th{border:1px solid #ccc;padding:2px 8px;text-align:right}td:first-child{text-align:left}\
.chart .grid{stroke:#ddd}.chart .tick,.chart .axis{font-size:11px;fill:#555}\
.chart .tick{text-anchor:end}.chart .label{font-size:10px;fill:#333;text-anchor:middle}.chart .bar:hover{opacity:.7}\
.legend span{margin-right:16px}.legend i{display:inline-block;width:12px;height:12px;margin-right:4px}\
.note{color:#777}figure{margin:0}";

/// Counts what rendered, so a headless browser's DOM says it (`data-bars`, `data-charts`).
const SCRIPT: &str = "(function(){var d=document.documentElement;\
d.dataset.charts=document.querySelectorAll('svg.chart').length;\
d.dataset.bars=document.querySelectorAll('svg.chart rect.bar').length;})();";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_escaped_and_bars_drawn() {
        let report = serde_json::json!({
            "target": "ort", "level": "O2", "passes": [], "total_ms": 1.0,
            "layers": [
                {"name": "<script>x</script>", "op": "MatMul", "modality": "vision",
                 "precision": "int8", "sqnr_db": 30.0, "cosine": 0.999},
                {"name": "b", "op": "Add", "modality": "text", "precision": "float",
                 "sqnr_db": null, "cosine": 1.0}
            ]
        });
        let html = render(&report).unwrap();
        assert!(!html.contains("<script>x"));
        assert!(html.contains("&lt;script&gt;x"));
        assert_eq!(html.matches("class=\"bar\"").count(), 2);
        assert!(html.contains("#1f77b4") && html.contains("#ff7f0e"));
        assert!(render(&serde_json::json!({"a": 1})).is_err());
    }
}
