//! top_sites and diff_sites, on hand-built profiles and on one that went through the encoder.

use std::sync::Arc;

use super::*;

fn frame(name: &str, filename: &str, line: i64) -> SourceFrame {
    SourceFrame {
        name: name.into(),
        filename: filename.into(),
        line,
    }
}

fn sample(
    frames: &[SourceFrame],
    class: Option<&str>,
    age: i64,
    objects: i64,
    bytes: i64,
) -> SampleData {
    SampleData {
        values: vec![objects, bytes],
        frames: Arc::from(frames),
        class: class.map(str::to_owned),
        gen_age: Some(age),
        retained_by: None,
    }
}

fn profile(samples: Vec<SampleData>) -> ProfileData {
    ProfileData {
        sample_types: vec![
            SampleType {
                name: LIVE_SAMPLES_TYPE.into(),
                unit: "count".into(),
            },
            SampleType {
                name: LIVE_SIZE_TYPE.into(),
                unit: "bytes".into(),
            },
        ],
        period_type: None,
        period: 1,
        comments: Vec::new(),
        time_nanos: 0,
        duration_nanos: 0,
        samples,
    }
}

fn stack(file: &str, line: i64) -> Vec<SourceFrame> {
    vec![
        frame("alloc", file, line),
        frame("<main>", "/app/main.rb", 1),
    ]
}

#[test]
fn top_sites_by_size_and_by_count() {
    let p = profile(vec![
        // few big objects
        sample(&stack("/app/big.rb", 1), Some("String"), 1, 10, 10_000),
        // many small ones, over two ages
        sample(&stack("/app/small.rb", 2), Some("Array"), 1, 300, 2_000),
        sample(&stack("/app/small.rb", 2), Some("Array"), 5, 100, 1_000),
        sample(&stack("/app/tiny.rb", 3), None, 2, 90, 7_000),
    ]);
    let by_size = top_sites(&p, 10, SortBy::Size);
    let order: Vec<_> = by_size.iter().map(|s| s.location.as_str()).collect();
    assert_eq!(
        order,
        ["/app/big.rb:1", "/app/tiny.rb:3", "/app/small.rb:2"]
    );
    assert_eq!(
        (by_size[2].live_objects, by_size[2].live_bytes),
        (400, 3_000)
    );
    assert!((by_size[0].share - 0.5).abs() < 1e-12);
    assert!((by_size.iter().map(|s| s.share).sum::<f64>() - 1.0).abs() < 1e-12);
    assert_eq!(by_size[1].class, None);
    assert_eq!(by_size[2].class.as_deref(), Some("Array"));

    let by_count = top_sites(&p, 2, SortBy::Count);
    let order: Vec<_> = by_count.iter().map(|s| s.location.as_str()).collect();
    assert_eq!(
        order,
        ["/app/small.rb:2", "/app/tiny.rb:3"],
        "truncated to n"
    );
    assert!((by_count[0].share - 400.0 / 500.0).abs() < 1e-12);
    // 300 objects of age 1, 100 of age 5: the weighted median is 1.
    assert_eq!(by_count[0].median_gen_age, Some(1));
    assert!(top_sites(&p, 0, SortBy::Size).is_empty());
}

#[test]
fn weighted_median_gen_age() {
    let s = stack("/app/a.rb", 1);
    let median =
        |samples: Vec<SampleData>| top_sites(&profile(samples), 1, SortBy::Count)[0].median_gen_age;
    assert_eq!(
        median(vec![sample(&s, None, 1, 10, 0), sample(&s, None, 7, 11, 0),]),
        Some(7)
    );
    assert_eq!(
        median(vec![sample(&s, None, 9, 5, 0), sample(&s, None, 2, 5, 0),]),
        Some(2),
        "an even split gives the lower age"
    );
    let mut no_age = sample(&s, None, 0, 5, 0);
    no_age.gen_age = None;
    assert_eq!(median(vec![no_age]), None);
}

#[test]
fn class_splits_a_stack_into_sites() {
    let s = stack("/app/a.rb", 1);
    let p = profile(vec![
        sample(&s, Some("String"), 1, 1, 10),
        sample(&s, Some("Hash"), 1, 1, 20),
    ]);
    let sites = top_sites(&p, 10, SortBy::Size);
    assert_eq!(sites.len(), 2);
    assert_eq!(sites[0].class.as_deref(), Some("Hash"));
}

fn app(dirs: &[&str]) -> SiteOptions {
    SiteOptions {
        app_root: AppRoot::new(dirs),
        ..SiteOptions::default()
    }
}

fn grouped(group: GroupBy, by: SortBy) -> SiteOptions {
    SiteOptions {
        by,
        group,
        app_root: AppRoot::new(["/app"]),
    }
}

#[test]
fn site_is_the_innermost_frame_and_called_from_the_nearest_app_frame() {
    let gem = "/usr/local/bundle/gems/activesupport-7.1.0/lib/active_support/core_ext.rb";
    let stdlib = "/usr/local/lib/ruby/3.3.0/set.rb";
    let vendored = "/app/vendor/bundle/ruby/3.3.0/gems/rack-3.0.0/lib/rack.rb";
    let frames = [
        // A C method has the file:line of the Ruby frame that called it.
        frame("String#*", stdlib, 520),
        frame("Set#add", stdlib, 520),
        frame("deep_dup", gem, 33),
        frame("call", vendored, 5),
        // The nearest app frame is a C frame too: it is named by the method that called it.
        frame("Array#each", "/app/models/cart.rb", 42),
        frame("Cart#total", "/app/models/cart.rb", 42),
        frame("<main>", "/app/main.rb", 1),
    ];
    let p = profile(vec![sample(&frames, Some("String"), 1, 1, 1)]);
    let site = &top_sites_with(&p, 1, &app(&["/app/"]))[0];
    assert_eq!(site.location, format!("{stdlib}:520"));
    assert_eq!(site.function, "Set#add");
    assert_eq!(site.callee.as_deref(), Some("String#*"));
    assert_eq!(site.label, format!("{stdlib}:520 in Set#add via String#*"));
    assert_eq!(
        site.called_from.as_deref(),
        Some("/app/models/cart.rb:42 in Cart#total"),
        "the vendored gem under the app root is not app code"
    );
    assert_eq!(site.library, "set (stdlib)");
    assert_eq!(site.stacks, 1);
    assert_eq!(*site.frames, frames);

    // Without an app root nothing absolute is app code: no called-from.
    let site = &top_sites(&p, 1, SortBy::Size)[0];
    assert_eq!(site.location, format!("{stdlib}:520"));
    assert_eq!(site.called_from, None);

    // A site in app code has no called-from; a Ruby innermost frame no callee.
    let site = &top_sites_with(&p, 1, &app(&["/usr/local/lib/ruby"]))[0];
    assert_eq!(
        (site.library.as_str(), site.called_from.as_deref()),
        ("app", None)
    );
    let p = profile(vec![sample(&frames[1..], None, 1, 1, 1)]);
    let site = &top_sites_with(&p, 1, &app(&["/app"]))[0];
    assert_eq!(site.callee, None);
    assert_eq!(site.label, format!("{stdlib}:520 in Set#add"));

    // Ruby's <internal:...> methods count as the C methods they mostly replace.
    let internal = [
        frame(
            "require",
            "<internal:/usr/lib/ruby/vendor_ruby/rubygems/core_ext/kernel_require.rb>",
            85,
        ),
        frame(
            "require",
            "<internal:/usr/lib/ruby/vendor_ruby/rubygems/core_ext/kernel_require.rb>",
            85,
        ),
        frame(
            "<class:Markdown>",
            "/usr/lib/ruby/3.1.0/rdoc/markdown.rb",
            538,
        ),
        frame(
            "<top (required)>",
            "/usr/lib/ruby/3.1.0/rdoc/markdown.rb",
            182,
        ),
    ];
    let p = profile(vec![sample(&internal, None, 1, 1, 1)]);
    let site = &top_sites(&p, 1, SortBy::Size)[0];
    assert_eq!(
        site.label,
        "/usr/lib/ruby/3.1.0/rdoc/markdown.rb:538 in <class:Markdown> via require"
    );
    assert_eq!(site.library, "rdoc (stdlib)");

    // Only internal frames, or none.
    let p = profile(vec![sample(&internal[..2], None, 1, 1, 1)]);
    let site = &top_sites(&p, 1, SortBy::Size)[0];
    assert!(site.location.starts_with("<internal:"), "{site:?}");
    assert_eq!(site.library, "ruby (internal)");
    let p = profile(vec![sample(&[], None, 1, 1, 1)]);
    assert_eq!(top_sites(&p, 1, SortBy::Size)[0].location, "(no frames)");

    // A C extension's init frame is named by its file, and has no line.
    let so = "/usr/lib/x86_64-linux-gnu/ruby/3.1.0/date_core.so";
    let p = profile(vec![sample(&[frame(so, so, 0)], Some("Class"), 1, 1, 1)]);
    assert_eq!(top_sites(&p, 1, SortBy::Size)[0].label, so);
}

#[test]
fn app_frames_and_libraries() {
    let root = AppRoot::new(["/srv/app", "/srv/releases/42/"]);
    for (path, library) in [
        ("/srv/app/models/cart.rb", "app"),
        ("/srv/releases/42/lib/x.rb", "app"),
        ("app.rb", "app"),
        ("-e", "app"),
        ("/srv/application.rb", "(other)"),
        (
            "/srv/app/vendor/bundle/ruby/3.3.0/gems/rack-3.0.8/lib/rack.rb",
            "rack",
        ),
        (
            "vendor/bundle/ruby/3.3.0/gems/rack-3.0.8/lib/rack.rb",
            "rack",
        ),
        (
            "/usr/local/bundle/gems/net-http-0.4.1/lib/net/http.rb",
            "net-http",
        ),
        (
            "/usr/local/bundle/gems/nokogiri-1.15.4-x86_64-linux/lib/nokogiri.rb",
            "nokogiri",
        ),
        (
            "/usr/local/bundle/bundler/gems/rails-abcdef012345/activesupport/lib/a.rb",
            "rails",
        ),
        (
            "/usr/lib/ruby/gems/3.1.0/gems/rake-13.0.6/lib/rake.rb",
            "rake",
        ),
        (
            "/usr/share/rubygems-integration/all/gems/rspec-core-3.12.0/lib/rspec/core.rb",
            "rspec-core",
        ),
        ("/usr/lib/ruby/3.1.0/rdoc/markup/parser.rb", "rdoc (stdlib)"),
        ("/usr/lib/ruby/3.1.0/set.rb", "set (stdlib)"),
        (
            "/usr/lib/ruby/3.1.0/x86_64-linux-gnu/rbconfig.rb",
            "rbconfig (stdlib)",
        ),
        (
            "/home/u/.rubies/ruby-3.3.0/lib/ruby/3.3.0/json/common.rb",
            "json (stdlib)",
        ),
        (
            "/usr/lib/ruby/vendor_ruby/rubygems/request_set.rb",
            "rubygems (vendor_ruby)",
        ),
        (
            "/usr/lib/x86_64-linux-gnu/ruby/3.1.0/date_core.so",
            "date_core (stdlib)",
        ),
        (
            "/usr/lib/x86_64-linux-gnu/ruby/3.1.0/json/ext/parser.so",
            "json (stdlib)",
        ),
        ("/home/u/ruby/notes.rb", "(other)"),
        (
            "/usr/local/lib/ruby/site_ruby/3.3.0/mine.rb",
            "mine (site_ruby)",
        ),
        ("<internal:kernel>", "ruby (internal)"),
        ("(eval)", "(eval)"),
        ("(eval at /app/x.rb:3)", "(eval)"),
        ("", "(unknown)"),
        ("/usr/bin/rdoc", "(other)"),
    ] {
        assert_eq!(library_of(path, &root), library, "{path}");
        assert_eq!(is_app_frame(path, &root), library == "app", "{path}");
    }
    // A gem developed in a directory called gems is the app when it is the root.
    let mine = AppRoot::new(["/home/u/gems/mine"]);
    assert_eq!(library_of("/home/u/gems/mine/lib/mine.rb", &mine), "app");
    assert_eq!(
        library_of("/home/u/gems/mine/lib/mine.rb", &AppRoot::default()),
        "mine"
    );
    // "/" as the root makes every file app code.
    assert!(is_app_frame(
        "/usr/lib/ruby/3.1.0/set.rb",
        &AppRoot::new(["/"])
    ));
    assert!(
        !is_app_frame("/srv/app", &root),
        "the root directory itself is no file in it"
    );
}

#[test]
fn stacks_with_one_site_are_one_row() {
    let helper = frame("Util#pad", "/app/util.rb", 3);
    let lib = frame("Lib#fmt", "/usr/lib/ruby/3.1.0/lib.rb", 9);
    let p = profile(vec![
        // Two callers of the same helper, from app code: one site.
        sample(
            &[helper.clone(), frame("A#a", "/app/a.rb", 1)],
            Some("String"),
            1,
            5,
            50,
        ),
        sample(
            &[helper.clone(), frame("B#b", "/app/b.rb", 2)],
            Some("String"),
            1,
            7,
            70,
        ),
        // Two stacks through a library to two app lines: two sites, by called-from.
        sample(
            &[lib.clone(), frame("A#a", "/app/a.rb", 1)],
            Some("String"),
            1,
            1,
            10,
        ),
        sample(
            &[lib.clone(), frame("B#b", "/app/b.rb", 2)],
            Some("String"),
            1,
            2,
            20,
        ),
        // Another class at the helper's line: another site.
        sample(
            &[helper.clone(), frame("A#a", "/app/a.rb", 1)],
            Some("Array"),
            1,
            1,
            5,
        ),
    ]);
    let sites = top_sites_with(&p, 10, &app(&["/app"]));
    let rows: Vec<_> = sites
        .iter()
        .map(|s| {
            (
                s.label.as_str(),
                s.class.as_deref(),
                s.called_from.as_deref(),
                s.live_objects,
                s.stacks,
            )
        })
        .collect();
    assert_eq!(
        rows,
        [
            ("/app/util.rb:3 in Util#pad", Some("String"), None, 12, 2),
            (
                "/usr/lib/ruby/3.1.0/lib.rb:9 in Lib#fmt",
                Some("String"),
                Some("/app/b.rb:2 in B#b"),
                2,
                1
            ),
            (
                "/usr/lib/ruby/3.1.0/lib.rb:9 in Lib#fmt",
                Some("String"),
                Some("/app/a.rb:1 in A#a"),
                1,
                1
            ),
            ("/app/util.rb:3 in Util#pad", Some("Array"), None, 1, 1),
        ]
    );
    // The heaviest stack stands for the site.
    assert_eq!(sites[0].frames[1].name, "B#b");

    let labels = |group, by| -> Vec<(String, i64)> {
        top_sites_with(&p, 10, &grouped(group, by))
            .into_iter()
            .map(|s| (s.place.label, s.live_objects))
            .collect()
    };
    assert_eq!(
        labels(GroupBy::Location, SortBy::Count),
        [
            ("/app/util.rb:3 in Util#pad".to_owned(), 13),
            ("/usr/lib/ruby/3.1.0/lib.rb:9 in Lib#fmt".to_owned(), 3),
        ]
    );
    assert_eq!(
        labels(GroupBy::File, SortBy::Size),
        [
            ("/app/util.rb".to_owned(), 13),
            ("/usr/lib/ruby/3.1.0/lib.rb".to_owned(), 3)
        ]
    );
    assert_eq!(
        labels(GroupBy::Gem, SortBy::Size),
        [("app".to_owned(), 13), ("lib (stdlib)".to_owned(), 3)]
    );
    assert_eq!(
        labels(GroupBy::Class, SortBy::Size),
        [("String".to_owned(), 15), ("Array".to_owned(), 1)]
    );
    let by_class = top_sites_with(&p, 10, &grouped(GroupBy::Class, SortBy::Size));
    assert_eq!(by_class[0].class.as_deref(), Some("String"));
    assert_eq!(by_class[0].stacks, 4);
    assert!((by_class[0].share - 150.0 / 155.0).abs() < 1e-12);
    let by_gem = top_sites_with(&p, 10, &grouped(GroupBy::Gem, SortBy::Size));
    assert_eq!(
        by_gem[0].class, None,
        "only site and class groups keep the class"
    );
    assert_eq!(by_gem[0].library, "app");
}

#[test]
fn heaviest_stack_does_not_depend_on_sample_order() {
    let a = [frame("f", "/app/f.rb", 1), frame("a", "/app/a.rb", 1)];
    let b = [frame("f", "/app/f.rb", 1), frame("b", "/app/b.rb", 1)];
    let forward = profile(vec![sample(&a, None, 1, 1, 10), sample(&b, None, 1, 1, 10)]);
    let backward = profile(vec![sample(&b, None, 1, 1, 10), sample(&a, None, 1, 1, 10)]);
    let options = app(&["/app"]);
    assert_eq!(
        top_sites_with(&forward, 1, &options),
        top_sites_with(&backward, 1, &options)
    );
    assert_eq!(top_sites_with(&forward, 1, &options)[0].frames[1].name, "a");
}

#[test]
fn merged_profiles_sum() {
    let a = stack("/app/a.rb", 1);
    let b = stack("/app/b.rb", 2);
    let mut one = profile(vec![sample(&a, Some("String"), 1, 10, 100)]);
    one.period = 512;
    (one.time_nanos, one.duration_nanos) = (1_000, 100);
    let mut two = profile(vec![
        sample(&a, Some("String"), 3, 5, 50),
        sample(&b, None, 1, 1, 1),
    ]);
    two.period = 512;
    (two.time_nanos, two.duration_nanos) = (2_000, 500);
    let sum = merge_profiles(&[&one, &two]).unwrap();
    assert_eq!(sum.samples.len(), 3);
    assert_eq!(
        (sum.period, sum.time_nanos, sum.duration_nanos),
        (512, 1_000, 1_500)
    );
    let sites = top_sites(&sum, 10, SortBy::Size);
    assert_eq!((sites[0].live_objects, sites[0].live_bytes), (15, 150));
    assert_eq!(sites[0].median_gen_age, Some(1));
    assert_eq!(merge_profiles(&[&one]).unwrap(), one);

    // Different periods: none; a profile without sizes: a sum without sizes.
    let mut no_sizes = profile(vec![sample(&b, None, 1, 4, 0)]);
    no_sizes.sample_types.truncate(1);
    no_sizes
        .samples
        .iter_mut()
        .for_each(|s| s.values.truncate(1));
    let sum = merge_profiles(&[&one, &no_sizes, &two]).unwrap();
    assert_eq!((sum.period, sum.period_type.clone()), (0, None));
    assert_eq!(sum.sample_types, no_sizes.sample_types);
    assert_eq!(sum.bytes_index(), None);
    assert_eq!(
        sum.samples
            .iter()
            .map(|s| s.values.clone())
            .collect::<Vec<_>>(),
        [vec![10], vec![4], vec![5], vec![1]]
    );

    // Nothing in common, or nothing at all.
    let mut go = profile(vec![]);
    go.sample_types = vec![SampleType {
        name: "inuse_space".into(),
        unit: "bytes".into(),
    }];
    let err = merge_profiles(&[&one, &two, &go]).unwrap_err().to_string();
    assert_eq!(
        err,
        "pprof: profile 3 of 3 has no sample type in common with the ones before it \
         (it has inuse_space/bytes; the first has heap-live-samples/count, heap-live-size/bytes)"
    );
    assert_eq!(
        merge_profiles(&[]).unwrap_err().to_string(),
        "pprof: no profile to sum"
    );
}

#[test]
fn diff_groups_like_top() {
    let lib = frame("Lib#fmt", "/usr/lib/ruby/3.1.0/lib.rb", 9);
    let old = profile(vec![sample(
        &[lib.clone(), frame("A#a", "/app/a.rb", 1)],
        Some("String"),
        1,
        1,
        10,
    )]);
    let new = profile(vec![
        sample(
            &[lib.clone(), frame("A#a", "/app/a.rb", 1)],
            Some("String"),
            1,
            3,
            30,
        ),
        sample(
            &[lib.clone(), frame("B#b", "/app/b.rb", 2)],
            Some("String"),
            1,
            2,
            20,
        ),
    ]);
    let diffs = diff_sites_with(&old, &new, &app(&["/app"]));
    let rows: Vec<_> = diffs
        .iter()
        .map(|d| {
            (
                d.called_from.as_deref(),
                d.old_objects,
                d.new_objects,
                d.bytes_change,
            )
        })
        .collect();
    assert_eq!(
        rows,
        [
            (Some("/app/a.rb:1 in A#a"), 1, 3, 20),
            (Some("/app/b.rb:2 in B#b"), 0, 2, 20)
        ]
    );
    assert_eq!(diffs[0].label, "/usr/lib/ruby/3.1.0/lib.rb:9 in Lib#fmt");
    let by_gem = diff_sites_with(&old, &new, &grouped(GroupBy::Gem, SortBy::Size));
    assert_eq!(by_gem.len(), 1);
    assert_eq!(
        (
            by_gem[0].label.as_str(),
            by_gem[0].old_bytes,
            by_gem[0].new_bytes,
            by_gem[0].bytes_relative
        ),
        ("lib (stdlib)", 10, 50, Some(4.0))
    );
}

#[test]
fn diff_ranks_growth_first() {
    let grows = stack("/app/leak.rb", 1);
    let steady = stack("/app/steady.rb", 2);
    let shrinks = stack("/app/cache.rb", 3);
    let appears = stack("/app/new.rb", 4);
    let vanishes = stack("/app/gone.rb", 5);
    let old = profile(vec![
        sample(&grows, Some("String"), 1, 10, 1_000),
        sample(&steady, None, 1, 5, 500),
        sample(&shrinks, None, 1, 50, 5_000),
        sample(&vanishes, None, 1, 1, 100),
    ]);
    let new = profile(vec![
        sample(&grows, Some("String"), 1, 30, 3_000),
        sample(&grows, Some("String"), 4, 10, 1_000),
        sample(&steady, None, 3, 5, 500),
        sample(&shrinks, None, 2, 20, 2_000),
        sample(&appears, None, 1, 2, 200),
    ]);
    let diffs = diff_sites(&old, &new);
    let order: Vec<_> = diffs
        .iter()
        .map(|d| (d.location.as_str(), d.bytes_change))
        .collect();
    assert_eq!(
        order,
        [
            ("/app/leak.rb:1", 3_000),
            ("/app/new.rb:4", 200),
            ("/app/steady.rb:2", 0),
            ("/app/gone.rb:5", -100),
            ("/app/cache.rb:3", -3_000),
        ]
    );
    let leak = &diffs[0];
    assert_eq!((leak.old_bytes, leak.new_bytes), (1_000, 4_000));
    assert_eq!(
        (leak.old_objects, leak.new_objects, leak.objects_change),
        (10, 40, 30)
    );
    assert_eq!(leak.bytes_relative, Some(3.0));
    assert_eq!(leak.objects_relative, Some(3.0));
    assert_eq!(leak.class.as_deref(), Some("String"));
    assert_eq!(
        diffs[1].bytes_relative, None,
        "new site: no relative change"
    );
    assert_eq!(diffs[3].bytes_relative, Some(-1.0));
}

#[test]
fn diff_without_sizes_ranks_by_objects() {
    let mut old = profile(vec![sample(&stack("/app/a.rb", 1), None, 1, 5, 0)]);
    let mut new = profile(vec![
        sample(&stack("/app/a.rb", 1), None, 1, 6, 0),
        sample(&stack("/app/b.rb", 1), None, 1, 9, 0),
    ]);
    for p in [&mut old, &mut new] {
        p.sample_types.truncate(1);
        p.samples.iter_mut().for_each(|s| s.values.truncate(1));
    }
    let diffs = diff_sites(&old, &new);
    assert_eq!(diffs[0].location, "/app/b.rb:1");
    assert_eq!((diffs[0].bytes_change, diffs[0].objects_change), (0, 9));
    assert_eq!(diffs[1].objects_relative, Some(0.2));
    assert_eq!(diffs[1].bytes_relative, None);
}

#[test]
fn summaries_of_an_encoded_profile() {
    let mut w = World::new(true);
    let lib = &[
        ("JSON.parse", "/usr/lib/ruby/3.3.0/json/common.rb", 216),
        ("Loader#load", "/app/loader.rb", 9),
        ("<main>", "/app/main.rb", 1),
    ];
    w.record(&[
        alloc(lib, Some("Hash"), 10, 100),
        alloc(APP, Some("String"), 1, 40),
    ]);
    let old = read_profile(&encode_world(&mut w).bytes).unwrap();
    w.record(&[alloc(APP, Some("String"), 100, 40)]);
    let new = read_profile(&encode_world(&mut w).bytes).unwrap();

    let top = top_sites_with(&old, 5, &app(&["/app"]));
    assert_eq!(top[0].location, "/usr/lib/ruby/3.3.0/json/common.rb:216");
    assert_eq!(
        top[0].called_from.as_deref(),
        Some("/app/loader.rb:9 in Loader#load")
    );
    assert_eq!((top[0].live_objects, top[0].live_bytes), (10, 1_000));
    assert_eq!(top[0].median_gen_age, Some(1));
    assert_eq!(top[1].location, "/app/foo.rb:12");

    let diffs = diff_sites(&old, &new);
    assert_eq!(diffs[0].location, "/app/foo.rb:12");
    assert_eq!(diffs[0].bytes_change, 4_000);
    assert_eq!(diffs[0].bytes_relative, Some(100.0));
    assert_eq!(diffs[1].bytes_change, 0);
}

#[test]
fn go_heap_profile_types_are_understood() {
    let mut p = profile(vec![]);
    p.sample_types = [
        "alloc_objects/count",
        "alloc_space/bytes",
        "inuse_objects/count",
        "inuse_space/bytes",
    ]
    .iter()
    .map(|t| {
        let (name, unit) = t.split_once('/').unwrap();
        SampleType {
            name: name.into(),
            unit: unit.into(),
        }
    })
    .collect();
    assert_eq!((p.objects_index(), p.bytes_index()), (Some(2), Some(3)));
}

#[test]
fn short_paths_name_the_gem_or_library_and_keep_the_rest() {
    let root = AppRoot::new(["/srv/app"]);
    for (path, short) in [
        ("/srv/app/app/models/user.rb", "app/models/user.rb"),
        ("lib/tasks.rb", "lib/tasks.rb"),
        (
            "/srv/app/vendor/bundle/ruby/3.3.0/gems/rack-3.0.8/lib/rack/utils.rb",
            "rack-3.0.8 rack/utils.rb",
        ),
        (
            "/var/lib/gems/3.1.0/gems/puma-6.4.0/lib/puma/client.rb",
            "puma-6.4.0 puma/client.rb",
        ),
        (
            "/usr/local/bundle/gems/nokogiri-1.15.4-x86_64-linux/lib/nokogiri.rb",
            "nokogiri-1.15.4-x86_64-linux nokogiri.rb",
        ),
        // Not under lib/: the path inside the gem as it is.
        (
            "/usr/local/bundle/bundler/gems/rails-abcdef012345/activesupport/lib/a.rb",
            "rails-abcdef012345 activesupport/lib/a.rb",
        ),
        (
            "/usr/lib/ruby/3.1.0/json/common.rb",
            "stdlib json/common.rb",
        ),
        ("/usr/lib/ruby/3.1.0/set.rb", "stdlib set.rb"),
        (
            "/usr/lib/ruby/3.1.0/x86_64-linux-gnu/rbconfig.rb",
            "stdlib rbconfig.rb",
        ),
        (
            "/usr/lib/x86_64-linux-gnu/ruby/3.1.0/json/ext/parser.so",
            "stdlib json/ext/parser.so",
        ),
        (
            "/home/u/.rubies/ruby-3.3.0/lib/ruby/3.3.0/logger.rb",
            "stdlib logger.rb",
        ),
        (
            "/usr/lib/ruby/vendor_ruby/rubygems/request_set.rb",
            "vendor_ruby rubygems/request_set.rb",
        ),
        (
            "/usr/lib/ruby/vendor_ruby/3.1.0/mine.rb",
            "vendor_ruby mine.rb",
        ),
        (
            "/usr/local/lib/ruby/site_ruby/3.3.0/mine.rb",
            "site_ruby mine.rb",
        ),
        // Unchanged: pseudo-files, files of no known place, the root directory itself.
        ("<internal:kernel>", "<internal:kernel>"),
        ("(eval at /app/x.rb:3)", "(eval at /app/x.rb:3)"),
        ("", ""),
        ("/usr/bin/rdoc", "/usr/bin/rdoc"),
        ("/srv/app", "/srv/app"),
        ("/usr/lib/ruby/3.1.0/", "/usr/lib/ruby/3.1.0/"),
    ] {
        assert_eq!(short_path(path, &root), short, "{path}");
    }
    // The same classification as library_of: a root that holds Ruby's library makes it app code.
    assert_eq!(
        short_path("/usr/lib/ruby/3.1.0/set.rb", &AppRoot::new(["/usr/lib"])),
        "ruby/3.1.0/set.rb"
    );
}
