# frozen_string_literal: true

module DatadogHeap
  # Is it a leak? A verdict per site from a series of profiles (Profile.trend, `datadog-heap trend`).
  #
  # Profiles before the first one holding any live object (an app that had not allocated yet, a
  # Railtie's first profiles) are left out: a site's series starts where the heap does.
  #
  # Per site, live bytes y_i at the end time t_i of each profile are fitted with a weighted least
  # squares line (weights 1/var_i). var_i is the sampling variance of the site's estimated bytes:
  # each sampled object stands for w objects, so the Horvitz-Thompson variance of Σ w·size is
  # Σ w·(w-1)·size²; with k = B/(w·s) samples of size s that is (w-1)·B·s = B²/k, taken at the
  # fitted B (see #fit), and never below one object's (absent from a profile is not "zero for
  # sure"). w and s are the site's own, from the variances its profiles carry (w - 1 = Σ var of
  # objects / Σ objects, s from the bytes variance likewise), so a site resting on a few heavy
  # samples gets their large variance; for profiles that carry none, w is the period and s the
  # site's mean size (its bytes over its objects, all profiles). Unequal sizes make the true
  # variance larger, which the residual term below picks up.
  # When the points scatter more than sampling explains (reduced chi² > 1, n >= 3), the slope's
  # standard error is inflated by sqrt(chi²/(n-2)) (the residual variance takes over from the
  # sampling one); the test statistic slope/stderr is then read on the normal distribution.
  # (Student's t with n-2 degrees of freedom was tried: with 3 profiles it needs t > 63.7 for
  # 99.5%, so half of all clear leaks read steady.)
  #
  # Verdict: :growing when the one-sided confidence that the slope is > 0 is at least
  # CONFIDENCE (0.995) and the fitted growth over the series is at least MIN_RELATIVE_GROWTH (10%)
  # of the site's mean live bytes; :shrinking likewise for < 0; else :steady. A fit alone is
  # fooled by what a line does not describe, so a rise (or fall) must also:
  # - rest on at least MIN_SAMPLES sampled objects in some profile: one sample of weight 14824
  #   that appears and stays is a step, not a measurement of growth;
  # - not be at 0 at both ends (something that came and went);
  # - end higher than it started, having risen between at least MIN_STEPS pairs of consecutive
  #   profiles (a single step up then flat is not a trend).
  # Otherwise it reads :steady, with a note saying why. Measured on synthetic series
  # (spec/trend_spec.rb): pure sampling noise reads :steady in >= 99% of cases, and one heavy
  # sample stepping in never reads :growing.
  module Trend
    CONFIDENCE = 0.995
    MIN_RELATIVE_GROWTH = 0.10
    MIN_SAMPLES = 5
    MIN_STEPS = 2
    VERDICTS = %i[growing steady shrinking].freeze

    # The fit of one series. `slope` in bytes per second (nil with < 2 distinct times),
    # `stderr` its standard error, `confidence` (0.5..1.0) that its sign is right, `relative`
    # the fitted change over the series divided by the mean level, `intercept` the fitted bytes
    # at times[0]. `reason` (:few_samples, :zero_at_both_ends, :no_net_change, :one_step) and
    # `note` say why a fit that rose or fell enough reads :steady; nil otherwise.
    Fit = Struct.new(:slope, :intercept, :stderr, :confidence, :relative, :verdict, :variances, :reason, :note)

    module_function

    # Profile.trend's work: the profiles' sites joined by what they are, each fitted.
    def sites(profiles, **options)
      timed = profiles.each_with_index.map do |p, i|
        time = p.end_time
        raise Error, "#{p.display_name(i)} has no time (time_nanos is 0): cannot place it in a trend" unless time

        [time, p, i]
      end
      timed.sort_by! { |time, _, i| [time, i] }
      timed.each_cons(2) do |(t1, p1, i1), (t2, p2, i2)|
        next unless t1 == t2

        raise Error, "#{p1.display_name(i1)} and #{p2.display_name(i2)} have the same time (#{Time.at(t1).utc}): " \
          "a trend needs profiles taken at different times"
      end
      timed = timed.drop(leading_empty(timed.map { |_, p, _| p }))
      sizes = timed.all? { |_, p, _| p.sizes? }
      t0 = timed.empty? ? 0.0 : timed[0][0]
      times = timed.map { |time, _, _| time - t0 }
      # A site is its label, class and caller; a coarser group is its label (its other fields
      # describe its heaviest stack, which may differ from one profile to the next).
      by_site = options.fetch(:group, :site) == :site
      rows = {}
      timed.each_with_index do |(_, profile, _), at|
        profile.top(2**62 - 1, by: sizes ? :size : :count, **options).each do |site|
          key = by_site ? [site.label, site.class_name, site.called_from] : site.label
          rows[key] ||= [site, Array.new(timed.size) { Series::EMPTY }]
          rows[key][1][at] = Series.point(site, sizes)
        end
      end
      period = [timed.map { |_, profile, _| profile.period.to_i }.max.to_i, 1].max
      counted = timed.all? { |_, profile, _| profile.uncertainty? }
      trends = rows.map do |_, (site, points)|
        series = Series.new(points, period: period, counted: counted, sizes: sizes)
        fit = if times.size >= 2
          fit(times, series.values, period: series.weight, mean_size: series.size, samples: series.samples)
        else
          Fit.new(nil, series.values.sum.to_f, nil, 0.5, 0.0, :steady, Array.new(times.size, 0.0), :one_profile,
            "only one profile has live objects")
        end
        # By name: the place from the field list the extension exports, then the trend's own fields.
        values = Profile::PLACE_FIELDS.to_h { |field| [field, site[field]] }.merge(times: times, bytes: series.values,
          objects: series.objects, stddevs: fit.variances.map { |v| Math.sqrt(v) }, slope: fit.slope && fit.slope * 60,
          stderr: fit.stderr && fit.stderr * 60, confidence: fit.confidence, relative: fit.relative, verdict: fit.verdict,
          unit: sizes ? :bytes : :objects, intercept: fit.intercept, samples: series.samples, reason: fit.reason, note: fit.note)
        Profile::SiteTrend.new(*Profile::SiteTrend.members.map { |member| values.fetch(member) })
      end
      trends.sort_by.with_index do |t, i|
        case t.verdict
        when :growing then [0, -t.slope, i]
        when :steady then [1, -t.bytes.last, i]
        else [2, t.slope, i]
        end
      end
    end

    # How many of `profiles` (in time order) come before the first that holds a live object.
    def leading_empty(profiles)
      profiles.take_while { |p| p.total_objects.zero? }.size
    end

    # One site's values over the profiles, and the sampling model they imply.
    class Series
      # [bytes (objects without sizes), objects, samples, variance of the first, of objects]
      EMPTY = [0, 0, 0, 0.0, 0.0].freeze

      def self.point(site, sizes)
        value = sizes ? site.live_bytes : site.live_objects
        variance = sizes ? site.bytes_stddev : site.objects_stddev
        [value, site.live_objects, site.samples || 0, variance.to_f**2, site.objects_stddev.to_f**2].freeze
      end

      attr_reader :values, :objects

      # `counted`: every profile carries samples and variances; else they are estimated from the
      # `period` (the largest of the profiles').
      def initialize(points, period:, counted:, sizes:)
        @values = points.map { |p| p[0] }
        @objects = points.map { |p| p[1] }
        @counted = counted
        @period = period
        @sizes = sizes
        total_objects = @objects.sum
        @mean_size = (sizes && total_objects > 0) ? @values.sum.fdiv(total_objects) : 1.0
        @samples = points.map { |p| p[2] } if counted
        @variance = points.sum { |p| p[3] }
        @objects_variance = points.sum { |p| p[4] }
      end

      # The mean weight of a sample: 1 + Σ w(w-1) / Σ w over the series, or the period.
      def weight
        return @period unless @counted

        total = @objects.sum
        total > 0 ? 1.0 + @objects_variance / total : 1.0
      end

      # The size s for which (w-1)·B·s is the bytes variance: the site's measured one, or its
      # mean size.
      def size
        return @mean_size unless @counted && @sizes

        w = weight
        total = @values.sum
        (w > 1 && total > 0) ? @variance / ((w - 1) * total) : @mean_size
      end

      # Sampled objects in each profile: as counted, or estimated as objects / period.
      def samples
        @samples || @objects.map { |n| (n.to_f / @period).round }
      end
    end

    # Fits `bytes` (Array of Numeric) over `times` (seconds, same size). Each point's sampling
    # variance is (w-1)·ŷ·size for the fitted value ŷ (at least one object's, (w-1)·size²): w the
    # `period` (the mean weight of a sample), size the site's `mean_size`. Variances from the
    # fitted values rather than the observed ones (one reweighting pass over an unweighted fit),
    # since a low observed value would otherwise get a small variance and pull the line down.
    # `samples` are the sampled objects behind each point (nil: estimated as bytes / (period ·
    # size)); see the module comment for how they, and the shape of the series, can hold a
    # verdict back. Pure: the spec drives it.
    def fit(times, bytes, period:, mean_size:, samples: nil)
      n = times.size
      raise ArgumentError, "times and bytes must have the same size, got #{n} and #{bytes.size}" unless bytes.size == n
      raise ArgumentError, "a trend needs at least 2 points, got #{n}" if n < 2
      if samples && samples.size != n
        raise ArgumentError, "samples must have one count per point, got #{samples.size} for #{n} points"
      end

      t0 = times[0].to_f
      xs = times.map { |t| t.to_f - t0 }
      ys = bytes.map(&:to_f)
      first = line(xs, ys, Array.new(n, 1.0))
      return Fit.new(nil, ys.sum / n, nil, 0.5, 0.0, :steady, Array.new(n, 0.0)) unless first

      variances = xs.map { |x| variance(period, first[1] + first[0] * x, mean_size) }
      # No sampling (period 1): the points are exact; weigh them alike and let the residuals speak.
      weights = variances.map { |v| v > 0 ? 1.0 / v : 1.0 }
      slope, intercept, sxx = line(xs, ys, weights)
      se = Math.sqrt(1.0 / sxx)
      chi2 = xs.each_index.sum { |i| weights[i] * (ys[i] - intercept - slope * xs[i])**2 }
      if n >= 3 && (chi2 / (n - 2) > 1 || variances.all?(&:zero?))
        se *= Math.sqrt(chi2 / (n - 2))
      end
      confidence = if se > 0
        normal_cdf((slope / se).abs)
      else
        slope.zero? ? 0.5 : 1.0
      end
      mean = ys.sum / n
      relative = if mean > 0
        slope * (xs.max - xs.min) / mean
      else
        slope.zero? ? 0.0 : Float::INFINITY * (slope <=> 0)
      end
      verdict = if confidence >= CONFIDENCE && relative.abs >= MIN_RELATIVE_GROWTH && slope != 0
        slope > 0 ? :growing : :shrinking
      else
        :steady
      end
      # The direction the fit moved by enough to matter, confident or not.
      moved = if relative.abs >= MIN_RELATIVE_GROWTH && slope != 0
        slope > 0 ? :growing : :shrinking
      end
      reason, note = held_back(moved, ys, samples || estimated_samples(ys, period, mean_size))
      verdict = :steady if reason
      Fit.new(slope, intercept, se, confidence, relative, verdict, variances, reason, note)
    end

    # Sampled objects behind each value, when a profile does not say: value / (w · size).
    def estimated_samples(ys, period, mean_size)
      per_sample = period.to_f * [mean_size.to_f, 0.0].max
      ys.map { |y| per_sample > 0 ? (y / per_sample).round : 0 }
    end

    # [reason, note] when a series that moved (`direction` :growing or :shrinking: its fitted
    # change is at least MIN_RELATIVE_GROWTH) cannot be called so whatever the confidence (see
    # the module comment); nil when it can, or when it did not move (`direction` nil).
    def held_back(direction, ys, samples)
      return nil unless direction

      most = samples.max.to_i
      if most < MIN_SAMPLES
        return [:few_samples, "rests on #{most} sample#{"s" unless most == 1} at most (fewer than #{MIN_SAMPLES})"]
      end
      return [:zero_at_both_ends, "0 at both ends"] if ys.first.zero? && ys.last.zero?

      up = direction == :growing
      if up ? ys.last <= ys.first : ys.last >= ys.first
        return [:no_net_change, "ends #{up ? "no higher" : "no lower"} than it started"]
      end

      steps = ys.each_cons(2).count { |a, b| up ? b > a : b < a }
      return [:one_step, "#{up ? "rose" : "fell"} in #{steps} step#{"s" unless steps == 1} only"] if steps < MIN_STEPS

      nil
    end

    # [slope, intercept at x = 0, weighted Sxx] of the weighted least squares line; nil when all
    # x are equal.
    def line(xs, ys, weights)
      sw = weights.sum
      mx = xs.each_index.sum { |i| weights[i] * xs[i] } / sw
      my = xs.each_index.sum { |i| weights[i] * ys[i] } / sw
      sxx = xs.each_index.sum { |i| weights[i] * (xs[i] - mx)**2 }
      return nil if sxx <= 0

      slope = xs.each_index.sum { |i| weights[i] * (xs[i] - mx) * (ys[i] - my) } / sxx
      [slope, my - slope * mx, sxx]
    end

    # The sampling variance of a site's estimated live bytes `expected` in a profile with period
    # `period`, its objects of `mean_size` bytes on average: k = expected/(w·size) samples, each
    # adding w·(w-1)·size², so (w-1)·expected·size; at least one sample's worth.
    def variance(period, expected, mean_size)
      w = period.to_f
      return 0.0 if w <= 1 || mean_size <= 0

      (w - 1) * [expected.to_f, mean_size.to_f].max * mean_size
    end

    def normal_cdf(z)
      0.5 * Math.erfc(-z / Math.sqrt(2))
    end
  end
end
