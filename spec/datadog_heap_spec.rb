# frozen_string_literal: true

RSpec.describe DatadogHeap do
  it "loads a native extension built from the same version as the Ruby code" do
    expect(DatadogHeap._native_version).to eq(DatadogHeap::VERSION)
  end

  it "has a semantic version" do
    expect(DatadogHeap::VERSION).to match(/\A\d+\.\d+\.\d+/)
  end

  describe DatadogHeap::Error do
    it "is a RuntimeError, so code that rescues the reference recorder's errors still works" do
      expect(DatadogHeap::Error.ancestors).to include(RuntimeError)
      expect { raise DatadogHeap::Error, "boom" }.to raise_error(RuntimeError, "boom")
    end
  end
end
