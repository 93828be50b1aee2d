//! `limits.response_buffer_bytes` and `limits.response_budget_bytes`:
//! read into the ingress and peer settings, ranges checked by field.

use super::*;

#[test]
fn response_buffer_and_budget_are_read_and_checked() {
    let c = validate(ONE, "n1").unwrap();
    assert_eq!(c.ingress.response_buffer_bytes, 256 * 1024);
    assert_eq!(c.ingress.response_budget_bytes, 32 * 1024 * 1024);
    assert_eq!(c.peer.stream_window, 256 * 1024);
    let c = validate(
        &format!("[limits]\nresponse_buffer_bytes = 65536\nresponse_budget_bytes = 1048576\n{ONE}"),
        "n1",
    )
    .unwrap();
    assert_eq!(c.ingress.response_buffer_bytes, 65536);
    assert_eq!(c.peer.stream_window, 65536);
    assert_eq!(c.ingress.response_budget_bytes, 1 << 20);
    for (bad, field) in [
        (
            "response_buffer_bytes = 16383",
            "limits.response_buffer_bytes",
        ),
        (
            "response_buffer_bytes = 16777217",
            "limits.response_buffer_bytes",
        ),
        (
            "response_budget_bytes = 1048575",
            "limits.response_budget_bytes",
        ),
        (
            "response_budget_bytes = 1099511627777",
            "limits.response_budget_bytes",
        ),
    ] {
        match validate(&format!("[limits]\n{bad}\n{ONE}"), "n1") {
            Err(ConfigError::Invalid { field: f, .. }) => assert_eq!(f, field, "{bad}"),
            other => panic!("{bad}: {other:?}"),
        }
    }
}
