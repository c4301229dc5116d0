# frozen_string_literal: true

module DatadogHeap
  # Is it a leak? A verdict per site from a series of profiles (Profile.trend, `datadog-heap trend`).
  #
  # Per site, live bytes y_i at the end time t_i of each profile are fitted with a weighted least
  # squares line (weights 1/var_i). var_i is the sampling variance of the site's estimated bytes:
  # each sampled object stands for w objects (w = the profile's period), so the Horvitz-Thompson
  # variance of Σ w·size is Σ w·(w-1)·size²; with k = B/(w·s) samples of the site's mean size s
  # (its bytes over its objects, all profiles) that is (w-1)·B·s, taken at the fitted B (see
  # #fit), and never below one sample's (absent from a profile is not "zero for sure"). Sizes
  # within a site are taken as equal; unequal sizes make the true variance larger, which the
  # residual term below picks up.
  # When the points scatter more than sampling explains (reduced chi² > 1, n >= 3), the slope's
  # standard error is inflated by sqrt(chi²/(n-2)) (the residual variance takes over from the
  # sampling one); the test statistic slope/stderr is then read on the normal distribution.
  # (Student's t with n-2 degrees of freedom was tried: with 3 profiles it needs t > 63.7 for
  # 99.5%, so half of all clear leaks read steady.)
  #
  # Verdict: :growing when the one-sided confidence that the slope is > 0 is at least
  # CONFIDENCE (0.995) and the fitted growth over the series is at least MIN_RELATIVE_GROWTH (10%)
  # of the site's mean live bytes; :shrinking likewise for < 0; else :steady. Measured on
  # synthetic series (spec/trend_spec.rb): pure sampling noise reads :steady in >= 99% of cases.
  module Trend
    CONFIDENCE = 0.995
    MIN_RELATIVE_GROWTH = 0.10
    VERDICTS = %i[growing steady shrinking].freeze

    # The fit of one series. `slope` in bytes per second (nil with < 2 distinct times),
    # `stderr` its standard error, `confidence` (0.5..1.0) that its sign is right, `relative`
    # the fitted change over the series divided by the mean level, `intercept` the fitted bytes
    # at times[0].
    Fit = Struct.new(:slope, :intercept, :stderr, :confidence, :relative, :verdict, :variances)

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
      sizes = timed.all? { |_, p, _| p.sizes? }
      t0 = timed[0][0]
      times = timed.map { |time, _, _| time - t0 }
      # A site is its label, class and caller; a coarser group is its label (its other fields
      # describe its heaviest stack, which may differ from one profile to the next).
      by_site = options.fetch(:group, :site) == :site
      rows = {}
      timed.each_with_index do |(_, profile, _), at|
        profile.top(2**62 - 1, by: sizes ? :size : :count, **options).each do |site|
          key = by_site ? [site.label, site.class_name, site.called_from] : site.label
          row = rows[key] ||= [site, Array.new(timed.size, 0), Array.new(timed.size, 0)]
          row[1][at] = sizes ? site.live_bytes : site.live_objects
          row[2][at] = site.live_objects
        end
      end
      trends = rows.map do |_, (site, bytes, objects)|
        total_objects = objects.sum
        mean_size = total_objects > 0 ? bytes.sum.to_f / total_objects : 0.0
        period = timed.map { |_, profile, _| profile.period.to_i }.max
        fit = fit(times, bytes, period: [period, 1].max, mean_size: sizes ? mean_size : 1.0)
        Profile::SiteTrend.new(site.locations, site.class_name, site.location, site.label, site.function, site.callee,
          site.called_from, site.library, times, bytes, objects, fit.variances.map { |v| Math.sqrt(v) },
          fit.slope && fit.slope * 60, fit.stderr && fit.stderr * 60, fit.confidence, fit.relative, fit.verdict,
          sizes ? :bytes : :objects, fit.intercept)
      end
      trends.sort_by.with_index do |t, i|
        case t.verdict
        when :growing then [0, -t.slope, i]
        when :steady then [1, -t.bytes.last, i]
        else [2, t.slope, i]
        end
      end
    end

    # Fits `bytes` (Array of Numeric) over `times` (seconds, same size). Each point's sampling
    # variance is (w-1)·ŷ·size for the fitted value ŷ (at least one sample's, (w-1)·size²): w the
    # `period`, size the site's `mean_size`. Variances from the fitted values rather than the
    # observed ones (one reweighting pass over an unweighted fit), since a low observed value
    # would otherwise get a small variance and pull the line down. Pure: the spec drives it.
    def fit(times, bytes, period:, mean_size:)
      n = times.size
      raise ArgumentError, "times and bytes must have the same size, got #{n} and #{bytes.size}" unless bytes.size == n
      raise ArgumentError, "a trend needs at least 2 points, got #{n}" if n < 2

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
      Fit.new(slope, intercept, se, confidence, relative, verdict, variances)
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
