# frozen_string_literal: true

module DatadogHeap
  module Report
    # Text from a profile (frame, file, class and thread names, comments, paths) as it may reach a
    # terminal. A profile can come from anywhere, and a name holding ESC or another control
    # character would otherwise drive the terminal that prints it (clear the screen, set its title,
    # rewrite earlier lines). Every text path of the CLI writes through Output, and puts names
    # through SafeText.escape where a newline would break a line or a table row.
    module SafeText
      # C0 controls, DEL and C1 controls (U+0080..U+009F); the same but the newline.
      CONTROL = /[\u0000-\u001f\u007f-\u009f]/
      CONTROL_BUT_NEWLINE = /[\u0000-\u0009\u000b-\u001f\u007f-\u009f]/
      NAMED = {"\e" => "\\e", "\n" => "\\n", "\r" => "\\r", "\t" => "\\t"}.freeze

      module_function

      # `text` (to_s of anything) as valid UTF-8 without control characters: ESC as \e, newline,
      # CR and tab as \n, \r, \t, any other C0 control or DEL as \xNN (BEL: \x07), a C1 control
      # as \u00NN, a byte that is not part of valid UTF-8 as \xNN. Other text is unchanged.
      def escape(text)
        replace(text, CONTROL)
      end

      # escape, except that newlines stay: for whole lines of output.
      def escape_lines(text)
        replace(text, CONTROL_BUT_NEWLINE)
      end

      def replace(text, pattern)
        s = text.to_s
        s = s.dup.force_encoding(Encoding::UTF_8) unless s.encoding == Encoding::UTF_8
        s = s.scrub { |bytes| bytes.unpack("C*").map { |b| format("\\x%02X", b) }.join } unless s.valid_encoding?
        return s unless pattern.match?(s)

        s.gsub(pattern) { |c| NAMED[c] || format(c.ord < 0x80 ? "\\x%02X" : "\\u%04X", c.ord) }
      end
      private_class_method :replace

      # An IO the CLI writes to: what it is given goes to `io` through escape_lines.
      class Output
        attr_reader :io

        def initialize(io)
          @io = io
        end

        def puts(*items)
          @io.puts(*items.flatten.map { |item| SafeText.escape_lines(item) })
        end

        def print(*items)
          @io.print(*items.map { |item| SafeText.escape_lines(item) })
        end

        def write(*items)
          @io.write(*items.map { |item| SafeText.escape_lines(item) })
        end

        def flush
          @io.flush
          self
        end
      end
    end
  end
end
