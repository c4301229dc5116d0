# frozen_string_literal: true

require_relative "format"

module DatadogHeap
  module Report
    # What keeps a report's top sites alive: the `retained by` labels a profile written with
    # Recorder#profile(retainers: ...) carries, under each top site, grouped by shape (the path
    # with its keys and indexes as `*`, Retainers::PathText.shape), so that a cache holding
    # thousands of entries reads as one holder. The text report shows each top site's main holder
    # in a line (#holder_lines), `report --why` and `datadog-heap why` all of them (#why_lines),
    # and the HTML page a section (Text#holder_rows).
    #
    # Hash keys are shown by class and size unless options[:values]: a profile written with
    # `retainers: {values: true}` (or by an older datadog_heap) carries them as they are, and
    # they are the program's data (a cookie, a token, an amount).
    module RetainerShapes
      include Format

      # The sample type that says how many objects a sample records (Profile#uncertainty?).
      RECORDS_TYPE = "heap-live-records"
      # How a profile picks the objects it searches paths for, for a reader of the counts.
      SEARCHED = "paths are searched for the largest few sampled objects of each top site " \
        "(Recorder#retainers' per_site, 3 by default)"

      # One shape of the paths of a site: the shape, an example path (keys shown as stored), the
      # sampled objects with a path of this shape (nil when the profile does not say) and the
      # live objects and bytes they stand for.
      Shape = Struct.new(:shape, :example, :sampled, :objects, :bytes)
      # What the paths of a site say: its Shapes, largest first, and the sampled and live objects
      # a path was found for (`sampled` nil when the profile does not say).
      Holders = Struct.new(:site, :shapes, :sampled, :objects)

      private

      # Under each row `report --why` printed, the paths of that site.
      def why_section(profile, sites, options)
        @out.puts
        unless profile.retained_by?
          @out.puts("(--why: #{profile.count > 1 ? "these profiles have" : "this profile has"} no retainer paths)")
          return
        end
        @out.puts("Retained by (paths grouped by shape):")
        shown = paths(options)
        holders(profile, sites, options).each do |held|
          site = held.site
          @out.puts("  #{SafeText.escape(shown.label(site, :site))} (#{SafeText.escape(site.class_name || "?")})")
          why_lines(profile, held, options).each { |line| @out.puts("    #{line}") }
        end
      end

      # The Holders of each of `sites` (Sites of `profile`, group :site), in their order.
      def holders(profile, sites, options)
        records = records_by_path(profile)
        retained = profile.top_retained(2**62 - 1, by: options.fetch(:by, :size), app_root: grouping(options)[:app_root])
        by_site = retained.to_h { |site, paths| [[site.label, site.class_name], paths] }
        sites.map do |site|
          shapes = {}
          by_site.fetch([site.label, site.class_name], []).each do |path, objects, bytes|
            shape = Retainers::PathText.shape(path)
            entry = shapes[shape] ||= Shape.new(shape, path, records && 0, 0, 0)
            entry.sampled += records[path] if records
            entry.objects += objects
            entry.bytes += bytes
          end
          list = shapes.values.sort_by { |s| [-s.bytes, -s.objects, -s.sampled.to_i, s.shape] }
          Holders.new(site, list, records && list.sum(&:sampled), list.sum(&:objects))
        end
      end

      # {path => sampled objects carrying it}, or nil when the profile does not count them.
      def records_by_path(profile)
        at = profile.sample_types.index { |type, _| type == RECORDS_TYPE }
        return nil unless at

        profile.samples.each_with_object(Hash.new(0)) do |sample, counts|
          counts[sample.retained_by] += sample.values[at] if sample.retained_by
        end
      end

      # The lines under a site: each shape with an example path, then how many of its sampled
      # objects have a path.
      def why_lines(profile, held, options)
        return ["(no sampled object of this site has a path; #{SEARCHED})"] if held.shapes.empty?

        lines = held.shapes.flat_map do |s|
          example = shown_path(s.example, options)
          shape = ["#{shape_counts(profile, held, s)}: #{SafeText.escape(s.shape)}"]
          shape << "   e.g. #{SafeText.escape(example)}" unless example == s.shape
          shape
        end
        lines << found_line(held)
      end

      # "paths found for 3 of the site's 1602 sampled objects (0.2%; 386 of its 204956 live objects)".
      def found_line(held)
        site = held.site
        live = "#{held.objects} of its #{site.live_objects} live objects"
        if held.sampled && site.samples
          "paths found for #{held.sampled} of the site's #{site.samples} sampled objects " \
            "(#{share(held.sampled, site.samples)}; #{live})"
        else
          "paths found for sampled objects standing for #{live} (#{share(held.objects, site.live_objects)})"
        end
      end

      # "2 of 3 sampled (67%), 257 objects, 31.0 KiB" for a Shape.
      def shape_counts(profile, held, shape)
        counts = if shape.sampled
          "#{shape.sampled} of #{held.sampled} sampled (#{share(shape.sampled, held.sampled)})"
        else
          share(shape.objects, held.objects)
        end
        "#{counts}, #{shape.objects} objects#{profile.sizes? ? ", #{human_bytes(shape.bytes)}" : ""}"
      end

      # A path as shown: its Hash keys by class and size unless --values.
      def shown_path(path, options)
        options[:values] ? path : Retainers::PathText.redact(path)
      end

      # One line per site of `sites` that has paths: its main holder, for the text report.
      def holder_lines(profile, sites, options)
        shown = paths(options)
        holders(profile, sites, options).filter_map do |h|
          main = h.shapes.first
          next unless main

          "#{SafeText.escape(shown.label(h.site, :site))} (#{SafeText.escape(h.site.class_name || "?")}): " \
            "#{SafeText.escape(main.shape)} " \
            "(#{main_share(h, main)})"
        end
      end

      # "2 of 3 paths found, 257 of 204956 live objects" for the main Shape of a site.
      def main_share(held, main)
        paths = if main.sampled
          "#{main.sampled} of #{plural(held.sampled, "sampled object")} with a path"
        else
          "#{share(main.objects, held.objects)} of the objects with a path"
        end
        "#{paths}; #{main.objects} of #{held.site.live_objects} live objects"
      end
    end
  end
end
