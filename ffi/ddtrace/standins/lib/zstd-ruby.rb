# frozen_string_literal: true

# Stand-in for the `zstd-ruby` gem (not on Debian), enough for dd-trace-rb's profiling specs,
# which only decompress profiles: Zstd.decompress over the system libzstd through Fiddle, with
# the streaming API (libdatadog writes frames without a content size).
require "fiddle"

module Zstd
  LIB = Fiddle.dlopen(ENV.fetch("ZSTD_LIB", "libzstd.so.1"))
  VOIDP = Fiddle::TYPE_VOIDP
  SIZE = Fiddle::TYPE_SIZE_T
  CREATE = Fiddle::Function.new(LIB["ZSTD_createDStream"], [], VOIDP)
  FREE = Fiddle::Function.new(LIB["ZSTD_freeDStream"], [VOIDP], SIZE)
  STREAM = Fiddle::Function.new(LIB["ZSTD_decompressStream"], [VOIDP, VOIDP, VOIDP], SIZE)
  IS_ERROR = Fiddle::Function.new(LIB["ZSTD_isError"], [SIZE], Fiddle::TYPE_INT)
  CHUNK = 1 << 16

  # ZSTD_inBuffer / ZSTD_outBuffer: { pointer, size_t size, size_t pos }, three machine words.
  def self.buffer(ptr, size) = [ptr.to_i, size, 0].pack("J3")

  def self.decompress(data)
    src = Fiddle::Pointer[data.b]
    dst = Fiddle::Pointer.malloc(CHUNK, Fiddle::RUBY_FREE)
    input = Fiddle::Pointer[buffer(src, data.bytesize)]
    stream = CREATE.call
    out = +"".b
    loop do
      output = Fiddle::Pointer[buffer(dst, CHUNK)]
      rc = STREAM.call(stream, output, input)
      raise ArgumentError, "zstd decompression failed" if IS_ERROR.call(rc) != 0

      written = output[16, 8].unpack1("J")
      out << dst.to_s(written)
      consumed = input[16, 8].unpack1("J")
      # Done once the frame is complete (rc 0) and all input is used, or nothing moves any more.
      break if (rc.zero? && consumed == data.bytesize) || (written.zero? && consumed == data.bytesize)
    end
    out
  ensure
    FREE.call(stream) if stream
  end
end
