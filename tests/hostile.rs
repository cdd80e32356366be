//! Hostile input: random bytes and near-valid documents into the parsers a client or a shared
//! config file can reach. Each must answer with an error value, never panic.

use proptest::prelude::*;

/// Cases per target: 2,000 in the regular run; `CORRAL_FUZZ_CASES=1000000` for a fuzzing
/// session (docs/RELIABILITY.md says how many ran).
fn cases() -> u32 {
    std::env::var("CORRAL_FUZZ_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(2_000)
}

/// A value for a TOML key: the fixed tricky ones above, or any string, integer, float or list.
fn any_value() -> impl Strategy<Value = String> {
    prop_oneof![
        any::<i64>().prop_map(|n| n.to_string()),
        any::<f64>().prop_filter("finite", |f| f.is_finite()).prop_map(|f| format!("{f:?}")),
        "[ -~]{0,24}".prop_map(|t| format!("{t:?}")),
        "(https?|ftp|file)://[a-z0-9.:@/%-]{0,30}".prop_map(|t| format!("{t:?}")),
        prop::collection::vec("[a-z0-9*.-]{0,10}", 0..4).prop_map(|v| format!("{v:?}")),
        any::<bool>().prop_map(|b| b.to_string()),
    ]
}

/// Near-valid shared files over every section and key a real file has, with any values.
fn shared_file() -> impl Strategy<Value = String> {
    let section = prop::sample::select(vec![
        ("[[nodes]]", vec!["name", "url", "kind", "weight", "max_concurrency", "enabled"]),
        (
            "[[categories]]",
            vec![
                "name",
                "policy",
                "priority",
                "queue_timeout_ms",
                "cloud",
                "providers",
                "redact",
                "models",
                "affinity",
                "wait_for_warm",
                "first_token_timeout_ms",
                "order",
                "redact_max_bytes",
            ],
        ),
        ("[[providers]]", vec!["name", "base_url", "secret", "connect_timeout_ms", "first_byte_timeout_ms"]),
        ("[[listeners]]", vec!["addr", "origin", "category", "api_keys", "categories", "allowed_origins", "model_ops"]),
        ("[admin]", vec!["addr", "max_connections", "max_connections_per_ip"]),
        (
            "[proxy]",
            vec![
                "max_body_bytes",
                "first_byte_timeout_ms",
                "idle_timeout_ms",
                "context_guard",
                "max_connections",
                "stream_buffer_bytes",
                "stream_buffer_total_bytes",
            ],
        ),
        ("[queue]", vec!["max_requests", "max_bytes", "remote_share", "remote_max_wait_ms", "max_model_ops"]),
        ("[retry]", vec!["max_attempts", "budget_ratio", "backoff_base_ms", "backoff_cap_ms"]),
        ("[health]", vec!["interval_ms", "timeout_ms", "failures_to_down", "readiness_model"]),
        ("[breaker]", vec!["failures_to_open", "cooldown_ms", "trial_requests"]),
    ]);
    let entry = (section, prop::collection::vec((any::<prop::sample::Index>(), any_value()), 0..6));
    prop::collection::vec(entry, 0..7).prop_map(|sections| {
        sections
            .into_iter()
            .map(|((header, keys), kvs)| {
                let body: String = kvs.into_iter().map(|(i, v)| format!("{} = {v}\n", i.get(&keys))).collect();
                format!("{header}\n{body}\n")
            })
            .collect()
    })
}

/// A running config to import into: the defaults, or one with nodes, a provider and a
/// category that may use it.
fn base_config(populated: bool) -> corral::Config {
    if !populated {
        return corral::Config::default();
    }
    corral::Config::parse(
        "[[nodes]]\nname = \"gpu1\"\nurl = \"http://127.0.0.1:11434\"\n\n[[providers]]\nname = \"openai\"\nbase_url = \"https://api.openai.com/v1\"\nsecret = \"openai\"\n\n[[categories]]\nname = \"default\"\n\n[[categories]]\nname = \"private\"\ncloud = \"never\"\n\n[[categories]]\nname = \"public\"\ncloud = \"on-failure\"\nproviders = [\"openai\"]\n",
    )
    .unwrap_or_default()
}

fn toml_ish() -> impl Strategy<Value = String> {
    let key = prop::sample::select(vec![
        "name",
        "url",
        "weight",
        "max_concurrency",
        "policy",
        "addr",
        "origin",
        "priority",
        "interval_ms",
        "nodes",
        "x",
    ]);
    let value = prop::sample::select(vec![
        "\"a\"",
        "1",
        "-1",
        "0",
        "1e400",
        "99999999999999999999",
        "true",
        "[1,2]",
        "{a=1}",
        "\"http://127.0.0.1:1\"",
        "\"\\u0000\"",
        "\"p2c\"",
        "\"\"",
    ]);
    let header = prop::sample::select(vec![
        "[[nodes]]",
        "[[categories]]",
        "[[listeners]]",
        "[health]",
        "[admin]",
        "[queue]",
        "[store]",
        "[bogus]",
        "[nodes]",
        "",
    ]);
    prop::collection::vec((header, prop::collection::vec((key, value), 0..4)), 0..6).prop_map(|sections| {
        sections
            .into_iter()
            .map(|(h, kvs)| {
                format!("{h}\n{}", kvs.into_iter().map(|(k, v)| format!("{k} = {v}\n")).collect::<String>())
            })
            .collect()
    })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: cases(), failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn config_parser_never_panics_on_random_text(text in ".{0,400}") {
        let _ = corral::Config::parse(&text);
    }

    #[test]
    fn config_parser_reports_near_valid_files_without_panicking(text in toml_ish()) {
        match corral::Config::parse(&text) {
            Ok(c) => prop_assert!(c.validate().is_empty(), "a config that parses is valid"),
            Err(e) => prop_assert!(!e.problems.is_empty(), "an error names at least one problem"),
        }
    }

    #[test]
    fn request_bodies_never_panic(body in prop::collection::vec(any::<u8>(), 0..512)) {
        let _ = corral::proxy::model_of(&body);
    }

    #[test]
    fn json_objects_with_a_model_are_accepted_and_others_named(
        model in "[a-z0-9.:/-]{0,20}",
        extra in prop::collection::vec(("[a-z]{1,8}", any::<i64>()), 0..5),
        nest in 0usize..300,
    ) {
        let mut obj = serde_json::Map::new();
        for (k, v) in extra {
            obj.insert(k, serde_json::json!(v));
        }
        obj.insert("model".into(), serde_json::json!(model));
        let deep = format!("{}1{}", "[".repeat(nest), "]".repeat(nest));
        obj.insert("deep".into(), serde_json::from_str(&deep).unwrap_or(serde_json::Value::Null));
        let body = serde_json::to_vec(&serde_json::Value::Object(obj)).unwrap_or_default();
        match corral::proxy::model_of(&body) {
            Ok((m, _, _)) => prop_assert_eq!(m, model),
            Err(e) => prop_assert!(model.is_empty() || nest > 120, "only an empty model or too-deep nesting is refused: {e}"),
        }
    }

    #[test]
    fn translating_odd_ollama_requests_never_panics(
        api in prop::sample::select(vec!["/api/chat", "/api/generate", "/api/embed", "/api/embeddings"]),
        messages in prop::sample::select(vec![
            "null", "[]", "\"hi\"", "[1]", "[{}]", "[{\"role\":5}]", "[{\"role\":\"user\",\"content\":[1]}]",
            "[{\"role\":\"assistant\",\"tool_calls\":[{\"function\":7}]}]", "[{\"role\":\"tool\"}]",
            "[{\"role\":\"user\",\"content\":\"x\",\"images\":[5,\"\"]}]",
        ]),
        options in prop::sample::select(vec!["null", "{}", "{\"num_predict\":-2}", "{\"stop\":5}", "{\"temperature\":\"hot\"}", "[1]", "{\"seed\":1e300}"]),
        other in prop::sample::select(vec!["null", "1", "\"json\"", "{}", "[\"a\"]", "[[]]"]),
    ) {
        let body = format!(r#"{{"model":"m","messages":{messages},"options":{options},"format":{other},"prompt":{other},"input":{other},"system":{other},"tools":{other}}}"#);
        let v: serde_json::Value = serde_json::from_str(&body).unwrap_or(serde_json::Value::Null);
        let api = corral::upstream::translate::Native::of(api).unwrap_or(corral::upstream::translate::Native::Chat);
        let _ = corral::upstream::translate::request(api, &v, "m", corral::upstream::translate::Audience::Cloud);
    }

    #[test]
    fn translating_random_upstream_streams_never_panics(chunks in prop::collection::vec(prop::collection::vec(any::<u8>(), 0..64), 0..8)) {
        let mut reply = corral::upstream::translate::Reply::native(
            corral::upstream::translate::Native::Chat, "m", tokio::time::Instant::now(), None);
        for c in &chunks {
            if reply.feed(c).is_err() {
                break;
            }
        }
        let _ = reply.end();
        let mut whole = corral::upstream::translate::Reply::native(
            corral::upstream::translate::Native::Generate, "m", tokio::time::Instant::now(), None);
        let _ = whole.whole(&chunks.concat());
    }

    #[test]
    fn near_valid_sse_events_never_panic(events in prop::collection::vec(prop::sample::select(vec![
        "data: {}", "data: []", "data: {\"choices\":5}", "data: {\"choices\":[{\"delta\":null}]}",
        "data: {\"choices\":[{\"delta\":{\"tool_calls\":[{\"index\":\"x\"}]}}]}", "data: [DONE]", ": comment",
        "data: {\"usage\":{\"prompt_tokens\":-1}}", "event: x", "data: {\"error\":5}", "data:", "data: \u{0}",
    ]), 0..10)) {
        let mut reply = corral::upstream::translate::Reply::native(
            corral::upstream::translate::Native::Chat, "m", tokio::time::Instant::now(), None);
        let wire: String = events.iter().map(|e| format!("{e}\n\n")).collect();
        let _ = reply.feed(wire.as_bytes());
        let _ = reply.end();
    }

    #[test]
    fn importing_near_valid_files_never_panics_and_never_yields_an_invalid_config(
        text in prop_oneof![toml_ish(), shared_file()],
        replace in any::<bool>(),
        accept_all in any::<bool>(),
        populated in any::<bool>(),
    ) {
        let base = base_config(populated);
        prop_assert!(base.validate().is_empty(), "the base is valid");
        let mode = if replace { corral::config::ImportMode::Replace } else { corral::config::ImportMode::Merge };
        let accept = if accept_all { corral::config::Accept::All } else { corral::config::Accept::none() };
        // The path the CLI and the admin API take: a file that does not parse is refused with
        // its problems; one that does yields a config that validates, whichever trust changes
        // are held back, and every change names what it changes.
        match corral::config::plan(&base, &text, mode, &accept) {
            Err(e) => prop_assert!(!e.problems.is_empty(), "a refusal says why"),
            Ok(plan) => {
                let problems = plan.next.validate();
                prop_assert!(problems.is_empty(), "import of {text:?} yields an invalid config: {problems:?}");
                prop_assert!(plan.changes.iter().all(|c| !c.name.is_empty() || c.kind == "section"));
            }
        }
    }

    #[test]
    fn redaction_never_panics_on_any_text(text in ".{0,300}") {
        let mut r = corral::redact::Redactor::new([text.as_str()]);
        let masked = r.redact(&text);
        prop_assert_eq!(r.restorer().restore_all(&masked), text);
    }
}
