# frozen_string_literal: true

require "fileutils"
require File.join(PROJECT_ROOT, "ext/memprofiler_pprof_rs/libclang_probe")

# script/bootstrap installs libclang only when this probe finds none, and
# extconf.rb warns from it: a false "found" means a build that fails in
# bindgen on a fresh machine (Debian 12 images carry LLVM 14's libclang-cpp
# without libclang).
RSpec.describe LibclangProbe do
  include_context "in a temporary directory"

  def touch(path)
    full = File.join(@dir, path)
    FileUtils.mkdir_p(File.dirname(full))
    File.write(full, "")
    full
  end

  def find(env = {})
    described_class.find(root: @dir, env: env)
  end

  it "finds nothing on a root that has only LLVM's libclang-cpp" do
    touch("usr/lib/llvm-14/lib/libclang-cpp.so.14")
    touch("usr/lib/x86_64-linux-gnu/libclang-cpp.so.14")
    touch("usr/lib/x86_64-linux-gnu/libLLVM-14.so.1")
    expect(find).to be_nil
  end

  it "finds Debian 12's libclang1-14 beside libclang-cpp" do
    touch("usr/lib/llvm-14/lib/libclang-cpp.so.14")
    path = touch("usr/lib/llvm-14/lib/libclang-14.so.1")
    expect(find).to eq(path)
  end

  it "finds a multiarch, an unversioned and a lib64 libclang" do
    ["usr/lib/x86_64-linux-gnu/libclang-19.so.19", "usr/lib/libclang.so",
     "usr/lib64/libclang.so.18.1"].each do |rel|
      Dir.mktmpdir("libclang-one") do |root|
        full = File.join(root, rel)
        FileUtils.mkdir_p(File.dirname(full))
        File.write(full, "")
        expect(described_class.find(root: root, env: {})).to eq(full)
      end
    end
  end

  it "does not count a dangling symlink" do
    FileUtils.mkdir_p(File.join(@dir, "usr/lib"))
    File.symlink("/nonexistent/libclang.so.1", File.join(@dir, "usr/lib/libclang.so"))
    expect(find).to be_nil
  end

  it "searches only LIBCLANG_PATH when it is set" do
    touch("usr/lib/llvm-14/lib/libclang-14.so.1")
    expect(find("LIBCLANG_PATH" => "/opt/none")).to be_nil
    path = touch("opt/llvm/lib/libclang.so")
    expect(find("LIBCLANG_PATH" => "/opt/llvm/lib")).to eq(path)
    # bindgen also takes the library file itself; not libclang-cpp's.
    expect(find("LIBCLANG_PATH" => "/opt/llvm/lib/libclang.so")).to eq(path)
    touch("opt/cpp/libclang-cpp.so.14")
    expect(find("LIBCLANG_PATH" => "/opt/cpp/libclang-cpp.so.14")).to be_nil
  end

  it "says so and exits 1 from the command line when there is none" do
    script = File.join(PROJECT_ROOT, "ext/memprofiler_pprof_rs/libclang_probe.rb")
    out, status = Open3.capture2e({ "LIBCLANG_PATH" => @dir }, RbConfig.ruby, script)
    expect(status.exitstatus).to eq(1)
    expect(out).to include("libclang not found")
  end
end
