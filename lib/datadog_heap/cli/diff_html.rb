# frozen_string_literal: true

module DatadogHeap
  class CLI
    # `datadog-heap diff OLD NEW --html [--out PATH]`: the diff as one self-contained page
    # (DatadogHeap::DiffHtml), a diff flame graph and the sites that grew and shrank most.
    module DiffHtmlCommand
      private

      # The diff parser's --html, --out and --by.
      def diff_html_options(parser, options)
        parser.on("--html", "write an HTML page with a diff flame graph (to stdout, or to --out PATH) instead") do
          options[:html] = true
        end
        parser.on("--out PATH", "with --html: where the page goes (default: stdout)") do |path|
          raise UsageError, "--out must not be empty" if path.empty?

          options[:out] = path
        end
      end

      # Writes the page, or the text diff when --html was not given.
      def diff_or_page(old, new, options)
        raise UsageError, "--out PATH writes the HTML page: it needs --html" if options[:out] && !options[:html]
        return diff(old, new, options) unless options[:html]

        require_relative "../diff_html"
        by = old.sizes? && new.sizes? ? options.fetch(:by, :size) : :count
        page = DiffHtml.page(old, new, paths: paths(options), by: by, group: grouping(options),
          top: options.fetch(:top, DEFAULT_TOP))
        if options[:out]
          path = Validate.path!(:out, options[:out])
          File.write(path, page)
          @out.puts("wrote #{path}")
        else
          @out.write(page)
        end
      end
    end
  end
end
