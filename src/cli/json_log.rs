//! `--log-format json`: one JSON object per event and line, in the shape
//! of tracing-subscriber's JSON format with `flatten_event(true)` and no
//! span list (`timestamp`, `level`, the event's fields, `target`, and
//! `span`: the current span's name and fields), with one difference: a
//! field whose value prints as a JSON array (a `Vec` or slice logged with
//! `?`, such as the serving members of "membership view changed" or the
//! gossip keyring's fingerprints) is written as that array, not as a
//! string holding it, so `jq '.serving[]'` reads it. Numbers and booleans
//! stay numbers and booleans; everything else is a string.

use std::fmt;

use tracing::field::{Field, Visit};
use tracing::{Event, Subscriber};
use tracing_subscriber::fmt::format::{JsonFields, Writer};
use tracing_subscriber::fmt::time::{FormatTime as _, SystemTime};
use tracing_subscriber::fmt::{FmtContext, FormatEvent, FormattedFields};
use tracing_subscriber::registry::LookupSpan;

/// The JSON event format (see the module doc). Span fields are those of
/// tracing-subscriber's [`JsonFields`].
pub(crate) struct JsonLines;

impl<S> FormatEvent<S, JsonFields> for JsonLines
where
    S: Subscriber + for<'a> LookupSpan<'a>,
{
    fn format_event(
        &self,
        ctx: &FmtContext<'_, S, JsonFields>,
        mut writer: Writer<'_>,
        event: &Event<'_>,
    ) -> fmt::Result {
        let mut time = String::new();
        SystemTime.format_time(&mut Writer::new(&mut time))?;
        let meta = event.metadata();
        let mut out = Object::default();
        out.entry("timestamp", &json_string(&time));
        out.entry("level", &json_string(meta.level().as_str()));
        event.record(&mut out);
        out.entry("target", &json_string(meta.target()));
        if let Some(span) = ctx.lookup_current() {
            let mut obj = Object::default();
            obj.entry("name", &json_string(span.name()));
            let ext = span.extensions();
            // JsonFields keeps a span's fields as the text of a JSON
            // object: its members go in after the name.
            if let Some(fields) = ext.get::<FormattedFields<JsonFields>>()
                && let Ok(serde_json::Value::Object(m)) =
                    serde_json::from_str::<serde_json::Value>(fields.as_str())
            {
                for (k, v) in m {
                    obj.entry(&k, &v.to_string());
                }
            }
            out.entry("span", &obj.finish());
        }
        writeln!(writer, "{}", out.finish())
    }
}

/// `s` as a JSON string literal.
fn json_string(s: &str) -> String {
    serde_json::Value::from(s).to_string()
}

/// A JSON object written member by member, in order; a later member of
/// the same name replaces nothing (tracing events have unique names).
#[derive(Default)]
struct Object {
    text: String,
}

impl Object {
    /// Appends `"key": value`, `value` already JSON text.
    fn entry(&mut self, key: &str, value: &str) {
        self.text.push(if self.text.is_empty() { '{' } else { ',' });
        self.text.push_str(&json_string(key));
        self.text.push(':');
        self.text.push_str(value);
    }

    /// The object's text.
    fn finish(mut self) -> String {
        if self.text.is_empty() {
            self.text.push('{');
        }
        self.text.push('}');
        self.text
    }
}

impl Visit for Object {
    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        let text = format!("{value:?}");
        let array = field.name() != "message"
            && text.starts_with('[')
            && serde_json::from_str::<serde_json::Value>(&text).is_ok_and(|v| v.is_array());
        if array {
            let v: serde_json::Value = serde_json::from_str(&text).expect("checked above");
            self.entry(field.name(), &v.to_string());
        } else {
            self.entry(field.name(), &json_string(&text));
        }
    }

    fn record_str(&mut self, field: &Field, value: &str) {
        self.entry(field.name(), &json_string(value));
    }

    fn record_i64(&mut self, field: &Field, value: i64) {
        self.entry(field.name(), &value.to_string());
    }

    fn record_u64(&mut self, field: &Field, value: u64) {
        self.entry(field.name(), &value.to_string());
    }

    fn record_bool(&mut self, field: &Field, value: bool) {
        self.entry(field.name(), if value { "true" } else { "false" });
    }

    fn record_f64(&mut self, field: &Field, value: f64) {
        // JSON has no NaN or infinity: those are strings.
        let text = serde_json::Number::from_f64(value)
            .map_or_else(|| json_string(&value.to_string()), |n| n.to_string());
        self.entry(field.name(), &text);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{Arc, Mutex};
    use tracing_subscriber::layer::SubscriberExt as _;

    /// What a subscriber with [`JsonLines`] writes for the events of `f`.
    fn lines(f: impl FnOnce()) -> Vec<serde_json::Value> {
        #[derive(Clone, Default)]
        struct Buf(Arc<Mutex<Vec<u8>>>);
        impl std::io::Write for Buf {
            fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
                self.0.lock().unwrap().extend_from_slice(b);
                Ok(b.len())
            }
            fn flush(&mut self) -> std::io::Result<()> {
                Ok(())
            }
        }
        let buf = Buf::default();
        let out = buf.clone();
        let subscriber = tracing_subscriber::registry().with(
            tracing_subscriber::fmt::layer()
                .json()
                .event_format(JsonLines)
                .with_writer(move || out.clone()),
        );
        tracing::subscriber::with_default(subscriber, f);
        let text = String::from_utf8(buf.0.lock().unwrap().clone()).unwrap();
        text.lines()
            .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
            .collect()
    }

    #[test]
    fn lists_are_arrays_numbers_numbers_and_the_rest_strings() {
        let got = lines(|| {
            let span = tracing::info_span!("peer", peer = "n3", attempt = 2u64);
            let _e = span.enter();
            let serving = vec!["n1".to_owned(), "n2".to_owned()];
            tracing::info!(
                target: "peerlb::node",
                version = 7u64,
                serving = ?serving,
                weights = %"n1=100 n2=100",
                up = true,
                share = 0.5,
                text = ?"[not, json]",
                "[membership] view changed"
            );
        });
        assert_eq!(got.len(), 1);
        let l = &got[0];
        assert_eq!(l["serving"], serde_json::json!(["n1", "n2"]), "{l}");
        assert_eq!(l["version"], 7, "{l}");
        assert_eq!(l["weights"], "n1=100 n2=100", "{l}");
        assert_eq!(l["up"], true, "{l}");
        assert_eq!(l["share"], 0.5, "{l}");
        // Debug of a &str is a JSON string literal, not an array.
        assert_eq!(l["text"], "\"[not, json]\"", "{l}");
        assert_eq!(l["message"], "[membership] view changed", "{l}");
        assert_eq!(l["level"], "INFO", "{l}");
        assert_eq!(l["target"], "peerlb::node", "{l}");
        assert_eq!(
            l["span"],
            serde_json::json!({"name": "peer", "peer": "n3", "attempt": 2}),
            "{l}"
        );
        assert!(l["timestamp"].as_str().unwrap().ends_with('Z'), "{l}");
    }

    #[test]
    fn an_event_outside_any_span_has_no_span_member() {
        let got =
            lines(|| tracing::warn!(keys = ?["7e4837f4", "c9b82b18"], "gossip keyring changed"));
        assert_eq!(got[0]["keys"], serde_json::json!(["7e4837f4", "c9b82b18"]));
        assert!(got[0].get("span").is_none(), "{}", got[0]);
        assert_eq!(got[0]["level"], "WARN");
    }
}
