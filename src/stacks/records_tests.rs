//! Unit tests of heap records.

use super::*;
use crate::strings::Strings;

fn named(frames: &[(&'static str, &'static str, i32)]) -> Vec<NamedFrame<'static>> {
    frames
        .iter()
        .map(|&(name, filename, line)| NamedFrame {
            name,
            filename,
            line,
        })
        .collect()
}

#[test]
fn equal_stacks_share_one_record() {
    let strings = Strings::new();
    let mut b = strings.lock().unwrap();
    let mut records = HeapRecords::default();
    let frames = named(&[("a", "x.rb", 1), ("b", "y.rb", 2)]);
    let (s1, _) = records.acquire(&mut b, &frames).unwrap();
    let (s2, _) = records.acquire(&mut b, &frames).unwrap();
    assert!(Arc::ptr_eq(&s1, &s2));
    assert_eq!(records.len(), 1);
    assert_eq!(records.count(&s1), 2);
}

#[test]
fn different_lines_are_different_stacks() {
    let strings = Strings::new();
    let mut b = strings.lock().unwrap();
    let mut records = HeapRecords::default();
    records
        .acquire(&mut b, &named(&[("a", "x.rb", 1)]))
        .unwrap();
    records
        .acquire(&mut b, &named(&[("a", "x.rb", 2)]))
        .unwrap();
    assert_eq!(records.len(), 2);
}

#[test]
fn last_release_leaves_a_dormant_record_that_the_second_sweep_gives_back() {
    let strings = Strings::new();
    let mut b = strings.lock().unwrap();
    let mut records = HeapRecords::default();
    let frames = named(&[("only_here", "only_here.rb", 1)]);
    let (s, claims) = records.acquire(&mut b, &frames).unwrap();
    records.acquire(&mut b, &frames).unwrap();
    records.release(&mut b, &s).unwrap();
    assert_eq!(b.get(s[0].name).unwrap(), "only_here");
    records.release(&mut b, &s).unwrap();
    assert!(records.is_empty());
    assert_eq!((records.dormant(), records.count(&s)), (1, 0));
    assert_eq!(records.iter().count(), 0);
    // Dormant, the very same stack is claimed again without interning.
    assert!(records.acquire_claimed(&claims).unwrap());
    assert_eq!((records.len(), records.dormant()), (1, 0));
    records.release(&mut b, &s).unwrap();
    // Claimed since the last sweep: the first keeps it, the second gives it back.
    assert_eq!(records.sweep_dormant(&mut b, false), 0);
    assert_eq!(b.get(s[0].name).unwrap(), "only_here");
    assert_eq!(records.sweep_dormant(&mut b, false), 1);
    assert_eq!((records.dormant(), records.refs()), (0, 0));
    assert!(!records.acquire_claimed(&claims).unwrap());
    assert!(b.get(s[0].name).is_err());
    assert!(b.get(s[0].filename).is_err());
    assert!(records.release(&mut b, &s).is_err());
}

#[test]
fn frame_cap_is_3000() {
    let strings = Strings::new();
    let mut b = strings.lock().unwrap();
    let mut records = HeapRecords::default();
    let frames = vec![
        NamedFrame {
            name: "f",
            filename: "f.rb",
            line: 1
        };
        3001
    ];
    let err = records.acquire(&mut b, &frames).unwrap_err();
    assert_eq!(
        err,
        HeapError::TooManyFrames {
            frames: 3001,
            limit: 3000
        }
    );
    assert!(err.to_string().contains("3001"));
    assert!(records.acquire(&mut b, &frames[..3000]).is_ok());
}

#[test]
fn count_overflow_is_an_error_and_changes_nothing() {
    let strings = Strings::new();
    let mut b = strings.lock().unwrap();
    let mut records = HeapRecords::default();
    let frames = named(&[("a", "x.rb", 1)]);
    let (s, _) = records.acquire(&mut b, &frames).unwrap();
    records.records[&*s].count.set(u32::MAX);
    let err = records.acquire(&mut b, &frames).unwrap_err();
    assert!(matches!(err, HeapError::TooManyObjectsForStack { .. }));
    assert_eq!(records.count(&s), u32::MAX);
}
