//! Uploads against real HTTP servers on 127.0.0.1 (std's TcpListener, one thread each): what
//! reaches the wire, and how each kind of failure is counted, kept or dropped.

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpListener;
use std::os::unix::net::UnixListener;
use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use super::*;

thread_local! {
    /// What `current_pid` answers on this test's thread, to act out a fork.
    pub(super) static FAKE_PID: std::cell::Cell<Option<u32>> = const { std::cell::Cell::new(None) };
}

/// One request as the server read it.
#[derive(Debug)]
struct Received {
    method: String,
    target: String,
    headers: HashMap<String, String>,
    body: Vec<u8>,
}

fn read_request<S: Read>(stream: &mut S) -> Option<Received> {
    let mut reader = BufReader::new(stream);
    let mut line = String::new();
    reader.read_line(&mut line).ok()?;
    let mut words = line.split_whitespace();
    let method = words.next()?.to_owned();
    let target = words.next()?.to_owned();
    let mut headers = HashMap::new();
    loop {
        let mut line = String::new();
        reader.read_line(&mut line).ok()?;
        let line = line.trim_end();
        if line.is_empty() {
            break;
        }
        let (k, v) = line.split_once(':')?;
        headers.insert(k.trim().to_ascii_lowercase(), v.trim().to_owned());
    }
    let mut body = Vec::new();
    if let Some(len) = headers.get("content-length") {
        body.resize(len.parse().ok()?, 0);
        reader.read_exact(&mut body).ok()?;
    } else if headers.get("transfer-encoding").map(String::as_str) == Some("chunked") {
        loop {
            let mut size = String::new();
            reader.read_line(&mut size).ok()?;
            let size = usize::from_str_radix(size.trim(), 16).ok()?;
            let mut chunk = vec![0; size + 2];
            reader.read_exact(&mut chunk).ok()?;
            if size == 0 {
                break;
            }
            body.extend_from_slice(&chunk[..size]);
        }
    }
    Some(Received {
        method,
        target,
        headers,
        body,
    })
}

/// How the test server answers.
#[derive(Clone, Copy)]
enum Answer {
    Status(u16),
    /// Reads the request, then never answers (holds the connection for 30 s).
    Hang,
}

/// A server answering every request with `answer`; the requests it read come out of the channel.
fn server(answer: Answer) -> (String, mpsc::Receiver<Received>) {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind 127.0.0.1");
    let url = format!("http://{}", listener.local_addr().expect("local addr"));
    let (tx, rx) = mpsc::channel();
    thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { return };
            let tx = tx.clone();
            thread::spawn(move || {
                let Some(request) = read_request(&mut stream) else {
                    return;
                };
                let _ = tx.send(request);
                match answer {
                    Answer::Status(status) => {
                        let _ = write!(
                            stream,
                            "HTTP/1.1 {status} X\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok"
                        );
                    }
                    Answer::Hang => thread::sleep(Duration::from_secs(30)),
                }
            });
        }
    });
    (url, rx)
}

/// A URL on which nothing listens.
fn dead_url() -> String {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind 127.0.0.1");
    let url = format!("http://{}", listener.local_addr().expect("local addr"));
    drop(listener);
    url
}

fn agent(url: &str, timeout: Duration) -> ProfileUploader {
    ProfileUploader::new(UploaderConfig {
        backend: Backend::DatadogAgent { url: url.into() },
        tags: vec!["service:shop".into(), "env:test".into(), "pid:42".into()],
        timeout,
        max_queue: 4,
        profiler_version: "9.9.9".into(),
    })
    .expect("uploader")
}

fn at(secs: u64) -> SystemTime {
    UNIX_EPOCH + Duration::from_secs(secs)
}

fn profile(byte: u8) -> PendingUpload {
    PendingUpload::new(
        vec![0x1f, 0x8b, byte, 1, 2, 3],
        at(1_700_000_000),
        at(1_700_000_060),
    )
}

fn stat(uploader: &ProfileUploader, name: &str) -> u64 {
    let (stats, _) = uploader.stats();
    match stats.iter().find(|(k, _)| *k == name) {
        Some((_, StatValue::Count(n))) => *n,
        other => panic!("{name}: {other:?}"),
    }
}

/// A multipart body's parts: (headers, body) in order.
fn parts(content_type: &str, body: &[u8]) -> Vec<(HashMap<String, String>, Vec<u8>)> {
    let boundary = content_type
        .split_once("boundary=")
        .map(|(_, b)| b.trim_matches('"'))
        .expect("boundary");
    let delimiter = format!("--{boundary}");
    let text = body;
    let mut out = Vec::new();
    let positions: Vec<usize> = text
        .windows(delimiter.len())
        .enumerate()
        .filter(|(_, w)| *w == delimiter.as_bytes())
        .map(|(i, _)| i)
        .collect();
    for pair in positions.windows(2) {
        let part = &text[pair[0] + delimiter.len() + 2..pair[1] - 2];
        let split = part
            .windows(4)
            .position(|w| w == b"\r\n\r\n")
            .expect("part headers");
        let headers = String::from_utf8_lossy(&part[..split])
            .lines()
            .filter_map(|l| l.split_once(':'))
            .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_owned()))
            .collect();
        out.push((headers, part[split + 4..].to_vec()));
    }
    let last = positions.last().expect("closing delimiter");
    assert_eq!(
        &text[last + delimiter.len()..last + delimiter.len() + 2],
        b"--"
    );
    out
}

#[test]
fn datadog_request_is_what_the_agent_intake_reads() {
    let (url, requests) = server(Answer::Status(202));
    let uploader = agent(&url, Duration::from_secs(5));
    uploader.enqueue(profile(7));
    let outcome = uploader.flush(&CancellationToken::new());
    assert_eq!(outcome.sent, 1, "{outcome:?}");
    assert_eq!(outcome.failure, None);

    let request = requests
        .recv_timeout(Duration::from_secs(5))
        .expect("request");
    assert_eq!(request.method, "POST");
    assert_eq!(request.target, "/profiling/v1/input");
    assert_eq!(request.headers["dd-evp-origin"], "datadog_heap");
    assert_eq!(request.headers["dd-evp-origin-version"], "9.9.9");
    let parts = parts(&request.headers["content-type"], &request.body);
    assert_eq!(parts.len(), 2);
    let (event_headers, event) = &parts[0];
    assert!(event_headers["content-disposition"].contains("name=\"event\""));
    assert!(event_headers["content-disposition"].contains("filename=\"event.json\""));
    assert_eq!(event_headers["content-type"], "application/json");
    let event: serde_json::Value = serde_json::from_slice(event).expect("event.json");
    assert_eq!(event["attachments"], serde_json::json!(["profile.pprof"]));
    assert_eq!(event["family"], "ruby");
    assert_eq!(event["version"], "4");
    assert_eq!(event["start"], "2023-11-14T22:13:20.000000000Z");
    assert_eq!(event["end"], "2023-11-14T22:14:20.000000000Z");
    assert_eq!(event["info"]["profiler"]["name"], "datadog_heap");
    let tags = event["tags_profiler"].as_str().expect("tags");
    for tag in ["service:shop", "env:test", "pid:42"] {
        assert!(tags.split(',').any(|t| t == tag), "{tag} in {tags}");
    }
    let (pprof_headers, pprof) = &parts[1];
    assert!(pprof_headers["content-disposition"].contains("name=\"profile.pprof\""));
    assert_eq!(pprof, &profile(7).pprof);
    assert_eq!(stat(&uploader, "upload_profiles_sent"), 1);
    assert_eq!(stat(&uploader, "upload_queue_length"), 0);
}

#[test]
fn datadog_agent_over_a_unix_socket() {
    let dir = std::env::temp_dir().join(format!("datadog-heap-uds-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let path = dir.join("apm.socket");
    let _ = std::fs::remove_file(&path);
    let listener = UnixListener::bind(&path).expect("bind unix socket");
    let (tx, requests) = mpsc::channel();
    thread::spawn(move || {
        if let Ok((mut stream, _)) = listener.accept() {
            if let Some(request) = read_request(&mut stream) {
                let _ = tx.send(request);
                let _ = write!(stream, "HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n");
            }
        }
    });
    let uploader = agent(
        &format!("unix://{}", path.display()),
        Duration::from_secs(5),
    );
    uploader.enqueue(profile(5));
    let outcome = uploader.flush(&CancellationToken::new());
    assert_eq!(outcome.sent, 1, "{outcome:?}");
    let request = requests
        .recv_timeout(Duration::from_secs(5))
        .expect("request");
    assert_eq!(request.target, "/profiling/v1/input");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn pyroscope_request_is_an_ingest_of_pprof_with_labels() {
    let (url, requests) = server(Answer::Status(200));
    let uploader = ProfileUploader::new(UploaderConfig {
        backend: Backend::Pyroscope {
            url: format!("{url}/"),
            app_name: "shop.heap".into(),
            auth_token: Some("sekret".into()),
            tenant_id: Some("team-a".into()),
        },
        tags: vec!["env:test".into(), "version:1.2".into()],
        timeout: Duration::from_secs(5),
        max_queue: 4,
        profiler_version: "9.9.9".into(),
    })
    .expect("uploader");
    uploader.enqueue(profile(9));
    let outcome = uploader.flush(&CancellationToken::new());
    assert_eq!(outcome.sent, 1, "{outcome:?}");

    let request = requests
        .recv_timeout(Duration::from_secs(5))
        .expect("request");
    assert_eq!(request.method, "POST");
    assert_eq!(
        request.target,
        "/ingest?name=shop.heap%7Benv%3Dtest%2Cversion%3D1.2%7D&from=1700000000&until=1700000060&format=pprof&spyName=datadog_heap"
    );
    assert_eq!(request.headers["authorization"], "Bearer sekret");
    assert_eq!(request.headers["x-scope-orgid"], "team-a");
    let parts = parts(&request.headers["content-type"], &request.body);
    assert_eq!(parts.len(), 2);
    assert!(parts[0].0["content-disposition"].contains("name=\"profile\""));
    assert_eq!(parts[0].1, profile(9).pprof);
    assert!(parts[1].0["content-disposition"].contains("name=\"sample_type_config\""));
    let config: serde_json::Value = serde_json::from_slice(&parts[1].1).expect("json");
    assert_eq!(config["heap-live-size"]["units"], "bytes");
    assert_eq!(config["heap-live-samples"]["aggregation"], "average");
}

#[test]
fn dead_port_is_a_connection_failure_and_the_profile_waits() {
    let uploader = agent(&dead_url(), Duration::from_secs(5));
    uploader.enqueue(profile(1));
    uploader.enqueue(profile(2));
    let outcome = uploader.flush(&CancellationToken::new());
    assert_eq!(outcome.sent, 0);
    let failure = outcome.failure.expect("failure");
    assert_eq!(failure.kind, FailureKind::Connection, "{failure:?}");
    // It stopped at the first failure: one attempt, both still queued.
    assert_eq!(stat(&uploader, "upload_attempts"), 1);
    assert_eq!(stat(&uploader, "upload_failures_connection"), 1);
    assert_eq!(uploader.queue_len(), 2);
    assert!(uploader.stats().1.is_some());
}

#[test]
fn server_error_is_retried_then_dropped() {
    let (url, _requests) = server(Answer::Status(500));
    let uploader = agent(&url, Duration::from_secs(5));
    uploader.enqueue(profile(1));
    for attempt in 1..=MAX_ATTEMPTS {
        let outcome = uploader.flush(&CancellationToken::new());
        assert_eq!(
            outcome.failure.map(|f| f.kind),
            Some(FailureKind::HttpStatus(500))
        );
        let left = if attempt < MAX_ATTEMPTS { 1 } else { 0 };
        assert_eq!(uploader.queue_len(), left, "after attempt {attempt}");
    }
    assert_eq!(stat(&uploader, "upload_failures_http_status"), 3);
    assert_eq!(stat(&uploader, "upload_dropped_retries_exhausted"), 1);
    assert_eq!(stat(&uploader, "upload_last_http_status"), 500);
    assert_eq!(stat(&uploader, "upload_profiles_sent"), 0);
}

#[test]
fn rejected_profile_is_dropped_and_the_next_one_tried() {
    let (url, requests) = server(Answer::Status(400));
    let uploader = agent(&url, Duration::from_secs(5));
    uploader.enqueue(profile(1));
    uploader.enqueue(profile(2));
    let outcome = uploader.flush(&CancellationToken::new());
    assert_eq!(
        outcome.failure.map(|f| f.kind),
        Some(FailureKind::HttpStatus(400))
    );
    assert_eq!(requests.try_iter().count(), 2);
    assert_eq!(stat(&uploader, "upload_dropped_rejected"), 2);
    assert_eq!(uploader.queue_len(), 0);
}

#[test]
fn hanging_server_costs_one_timeout() {
    let (url, _requests) = server(Answer::Hang);
    let uploader = agent(&url, Duration::from_millis(300));
    uploader.enqueue(profile(1));
    uploader.enqueue(profile(2));
    let began = Instant::now();
    let outcome = uploader.flush(&CancellationToken::new());
    let took = began.elapsed();
    assert_eq!(outcome.failure.map(|f| f.kind), Some(FailureKind::Timeout));
    assert!(took < Duration::from_secs(5), "took {took:?}");
    assert_eq!(stat(&uploader, "upload_failures_timeout"), 1);
    assert_eq!(uploader.queue_len(), 2);
}

#[test]
fn cancel_ends_a_hanging_request_and_keeps_the_profile() {
    let (url, _requests) = server(Answer::Hang);
    let uploader = agent(&url, Duration::from_secs(60));
    uploader.enqueue(profile(1));
    let token = CancellationToken::new();
    let canceller = token.clone();
    let began = Instant::now();
    thread::spawn(move || {
        thread::sleep(Duration::from_millis(200));
        canceller.cancel();
    });
    let outcome = uploader.flush(&token);
    assert_eq!(
        outcome.failure.map(|f| f.kind),
        Some(FailureKind::Cancelled)
    );
    assert!(began.elapsed() < Duration::from_secs(30));
    assert_eq!(uploader.queue_len(), 1);
    assert_eq!(stat(&uploader, "upload_failures_cancelled"), 1);
    // A cancelled attempt is not one of the profile's failures.
    assert_eq!(lock(&uploader.state().queue)[0].failures, 0);
}

#[test]
fn full_queue_drops_the_oldest() {
    let uploader = agent(&dead_url(), Duration::from_secs(1));
    for byte in 1..=6 {
        uploader.enqueue(profile(byte));
    }
    assert_eq!(uploader.queue_len(), 4);
    assert_eq!(stat(&uploader, "upload_dropped_queue_full"), 2);
    assert_eq!(stat(&uploader, "upload_profiles_enqueued"), 6);
    assert_eq!(lock(&uploader.state().queue)[0].pprof[2], 3);
}

#[test]
fn bad_configuration_is_an_invalid_argument() {
    let config = |backend, tags: Vec<String>, max_queue, timeout| UploaderConfig {
        backend,
        tags,
        timeout,
        max_queue,
        profiler_version: "1".into(),
    };
    let agent = |url: &str| Backend::DatadogAgent { url: url.into() };
    let second = Duration::from_secs(1);
    let cases = [
        (
            config(agent("localhost:8126"), vec![], 4, second),
            "agent url",
        ),
        (
            config(agent("http://x"), vec!["x:".into()], 4, second),
            "tags",
        ),
        (config(agent("http://x"), vec![], 0, second), "max_queue"),
        (config(agent("http://x"), vec![], 65, second), "max_queue"),
        (
            config(agent("http://x"), vec![], 4, Duration::ZERO),
            "timeout",
        ),
        (
            config(
                Backend::Pyroscope {
                    url: "http://x".into(),
                    app_name: "a{b".into(),
                    auth_token: None,
                    tenant_id: None,
                },
                vec![],
                4,
                second,
            ),
            "app_name",
        ),
    ];
    for (config, name) in cases {
        match ProfileUploader::new(config) {
            Err(HeapError::InvalidArgument { name: got, .. }) => assert_eq!(got, name),
            Err(other) => panic!("{name}: {other}"),
            Ok(_) => panic!("{name}: accepted"),
        }
    }
}

#[test]
fn a_forked_child_gets_state_of_its_own_even_with_the_parents_mutexes_held() {
    let (url, requests) = server(Answer::Status(202));
    let uploader = agent(&url, Duration::from_secs(5));
    uploader.enqueue(profile(1));
    // The fork happens while other threads of the parent flush and enqueue: the child inherits
    // the client, queue and last-error mutexes locked, with no thread left to unlock them.
    let parent = uploader.state();
    let _client = parent.client.lock().unwrap();
    let _queue = parent.queue.lock().unwrap();
    let _last_error = parent.last_error.lock().unwrap();
    FAKE_PID.with(|pid| pid.set(Some(std::process::id() + 1)));

    assert_eq!(
        uploader.queue_len(),
        0,
        "the parent's queued profile stays the parent's"
    );
    uploader.enqueue(profile(2));
    let outcome = uploader.flush(&CancellationToken::new());
    assert!(!outcome.busy, "not the parent's flush in progress");
    assert!(outcome.failure.is_none(), "{:?}", outcome.failure);
    assert_eq!(outcome.sent, 1);
    let sent = requests
        .recv_timeout(Duration::from_secs(5))
        .expect("a request");
    assert!(sent.body.windows(3).any(|w| w == [0x1f, 0x8b, 2]));
    assert_eq!(uploader.stats().1, None);
    FAKE_PID.with(|pid| pid.set(None));
}
