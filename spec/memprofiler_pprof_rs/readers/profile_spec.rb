# frozen_string_literal: true

RSpec.describe MemprofilerPprof::Profile do
  it "refuses things that are not profile data with clear errors" do
    expect { described_class.parse(nil) }.to raise_error(TypeError, /String or a ProfileData, got nil/)
    expect { described_class.parse("nope") }.to raise_error(MemprofilerPprof::ProfileFormatError, /not a pprof profile/)
    expect { described_class.new }.to raise_error(TypeError, /allocator undefined/)
    expect { described_class.merge([]) }.to raise_error(ArgumentError, /at least 1 profile/)
    expect { described_class.diff([1, 2]) }.to raise_error(TypeError, /needs Profiles, got 1/)
    cpu = described_class.parse(PprofWriter.build(sample_types: [%w[cpu nanoseconds]], samples: []))
    heap = described_class.parse(PprofWriter.build(sample_types: [%w[inuse_space bytes]], samples: []))
    expect { described_class.diff([heap, cpu], titles: %w[old.pprof cpu.pprof], sample_index: "inuse_space") }
      .to raise_error(ArgumentError, /\Acpu\.pprof: this profile has no sample type "inuse_space"; it has cpu\z/)
    expect { described_class.diff([heap, cpu], titles: ["one"]) }
      .to raise_error(ArgumentError, /titles must be an Array of 2 Strings/)
  end

  it "reads a collector's flush and answers top, totals and to_pprof" do
    collector = MemprofilerPprof::Collector.new(sample_rate: 1.0)
    collector.start!
    kept = Array.new(2_000) { "k" * 100 }
    GC.start # in use from now on (see Collector::INUSE_AS_OF)
    data = collector.flush
    collector.stop!
    profile = described_class.parse(data)
    expect(profile.sample_type_names).to eq(%w[alloc_objects alloc_space inuse_objects inuse_space])
    expect(profile.default_sample_type).to eq("inuse_space")
    expect(profile.totals["inuse_objects"]).to be >= kept.size
    expect(profile.time).to be_within(60).of(Time.now)
    expect(profile.top(by: :class)).to include("String")
    expect { profile.top(by: :planet) }
      .to raise_error(ArgumentError, /no sample has a label "planet" \(the profile's labels: class\)/)
    expect { profile.top(by: :"no-such") }
      .to raise_error(ArgumentError, /by must be one of function, line, class, file, gem or a label key.*got :"no-such"/)
    expect { profile.top(by: 3) }.to raise_error(TypeError, /by must be a Symbol or String, got 3/)
    expect { profile.top(limit: -1) }.to raise_error(ArgumentError, /limit must be an Integer >= 0.*got -1/)
    expect { profile.top(sample_index: 5) }.to raise_error(TypeError, /sample_index must be a String or Symbol/)
    expect { profile.flamegraph(format: :png) }.to raise_error(ArgumentError, /format must be one of html, svg/)
    allocs = described_class.parse(profile.to_pprof(default_sample_type: "alloc_space"))
    expect(allocs.default_sample_type).to eq("alloc_space")
    expect(allocs.totals).to eq(profile.totals)
    expect(profile.inspect)
      .to match(/#<MemprofilerPprof::Profile \d+ samples of alloc_objects, alloc_space, inuse_objects, inuse_space>/)
  end
end
