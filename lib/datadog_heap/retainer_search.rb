# frozen_string_literal: true

require_relative "retainers"

module DatadogHeap
  # Recorder#retainers, and Recorder#profile's retainers: and gc: around the extension's
  # #profile. Recorder prepends it (recorder.rb).
  module RetainerSearch
    # For the sampled live objects of the `top` sites (ranked by live bytes, `by: :size`, or
    # objects, `by: :count`, as `datadog-heap report` ranks them), up to `per_site` each (the
    # largest first), a shortest chain of references from a GC root. See Retainers. The search
    # holds the GVL; it stops at `max_visited` objects or after `time_budget` seconds, whichever
    # comes first, and follows no path longer than `max_depth` references; Retainers#stopped
    # and #depth_cut say when that cut it short. `app_root` is Profile#top's. Hash keys in the
    # paths are shown by class and size (`key (String, 12 bytes)`); `values: true` shows them as
    # they are, which puts the program's data (a cookie, a token) in the paths (see Retainers).
    def retainers(**options)
      Validate.known_keys!("#{self.class}#retainers", options, Recorder::RETAINERS_DEFAULTS)
      o = Recorder::RETAINERS_DEFAULTS.merge(options)
      Validate.integer!(:top, o[:top], 1, 1000)
      Validate.integer!(:per_site, o[:per_site], 1, 100)
      Validate.integer!(:max_depth, o[:max_depth], 1, 10_000)
      Validate.integer!(:max_visited, o[:max_visited], 1, 2**32 - 2)
      Validate.positive_number!(:time_budget, o[:time_budget], 86_400)
      Validate.one_of!(:by, o[:by], Recorder::RETAINERS_SORT_KEYS)
      Validate.boolean!(:values, o[:values])
      roots = Profile.app_roots(o[:app_root].nil? ? Profile.default_app_root : o[:app_root])
      raw_sites = _native_retainer_targets(o[:top], o[:per_site], o[:by].to_s, roots)
      ids = raw_sites.flat_map { |s| s.last.map(&:first) }
      paths, visited, elapsed, stopped, depth_cut = _native_retainer_paths(ids, o[:max_depth], o[:max_visited], o[:time_budget].to_f)
      complete = stopped.nil? && !depth_cut
      at = -1
      sites = raw_sites.map do |*site, objects|
        retained = objects.map do |record_id, class_name, size, weight, gen_age|
          path = paths[at += 1]
          status, text, root, steps = case path
          when nil then [:collected]
          when false then [complete ? :unreachable : :not_found]
          else [:alive, *Retainers::Namer.name_path(*path, o[:values])]
          end
          Retainers::Retained.new(record_id, class_name, size, weight, gen_age, status, text, root, steps&.freeze)
        end
        Retainers::Site.new(*site, retained.freeze)
      end
      Retainers.new(sites, visited: visited, elapsed: elapsed, stopped: stopped&.to_sym, depth_cut: depth_cut,
        limits: o.slice(:max_depth, :max_visited, :time_budget, :values))
    end

    # The gzip pprof of the live objects (see docs/cli.md). With `retainers:` (true, a Hash of
    # #retainers options, or a Retainers already computed), the objects a path was found for
    # carry a `retained by` label with it; Hash keys in it are shown by class and size unless
    # the options say `values: true`. `gc: true` runs a full GC first, so objects the
    # program dropped but the GC has not collected yet are not listed (default: the preset's, see
    # Recorder#gc_before_profile?); the profile's notes say whether one ran. The gem's own
    # allocations here are never sampled.
    def profile(retainers: nil, gc: nil)
      Validate.boolean!(:gc, gc) unless NilClass === gc
      DatadogHeap.own_work do
        if NilClass === gc ? gc_before_profile? : gc
          GC.start
          _native_note_full_gc
        end
        found = retainers_for(retainers)
        found ? _native_profile_retained(found.paths_by_record_id.to_a) : super()
      end
    end

    private

    # The Retainers `retainers` (#profile's argument) asks for, nil for none.
    def retainers_for(retainers)
      return nil if NilClass === retainers || FalseClass === retainers

      case retainers
      when Retainers then retainers
      when TrueClass then self.retainers
      when Hash then self.retainers(**retainers)
      else
        raise TypeError, "retainers must be true, false, nil, a Hash of #retainers options or a " \
          "#{Retainers}, got #{Validate.describe(retainers)}"
      end
    end
  end
end
