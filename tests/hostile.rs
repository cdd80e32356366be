//! Hostile input: random bytes and near-valid documents into the parsers a client or a shared
//! config file can reach. Each must answer with an error value, never panic.

use proptest::prelude::*;

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
    #![proptest_config(ProptestConfig { cases: 2000, ..ProptestConfig::default() })]

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
}
