# Thin wrapper over CMake. The two set-up commands of the README:
#   make demo   install what is missing, build, serve the default model
#   make check  install what is missing, build (normal + ASan/UBSan), run all tests
BUILD ?= build
ASAN_BUILD ?= build-asan
JOBS ?= $(shell nproc)
CMAKE_FLAGS ?=
ifeq ($(CUDA),1)
CMAKE_FLAGS += -DTERN_CUDA=ON
endif

.PHONY: all deps oracles demo check test test-asan asan clean desktop desktop-check
all:
	@cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=Release $(CMAKE_FLAGS) >/dev/null
	@cmake --build $(BUILD) -j $(JOBS)

deps:
	@bash scripts/install-deps.sh

oracles: deps
	@bash scripts/install-oracles.sh

asan:
	@cmake -S . -B $(ASAN_BUILD) -DCMAKE_BUILD_TYPE=Debug -DTERN_SANITIZE=ON -DCMAKE_C_FLAGS_DEBUG="-O1 -g" $(CMAKE_FLAGS) >/dev/null
	@cmake --build $(ASAN_BUILD) -j $(JOBS)

# tern-desktop (desktop/): installs GTK + WebKitGTK + Xvfb if missing, then
# builds it with the rest; desktop-check runs its Xvfb test.
desktop: deps
	@$(MAKE) --no-print-directory all
	@test -x $(BUILD)/desktop/tern-desktop && echo "tern-desktop: $(BUILD)/desktop/tern-desktop"

desktop-check: desktop
	@cd $(BUILD) && ctest -R '^desktop\.' --output-on-failure

demo: deps all
	@bash scripts/demo.sh

test: all
	@cd $(BUILD) && ctest --output-on-failure -j $(JOBS)

test-asan: asan
	@cd $(ASAN_BUILD) && ctest --output-on-failure -j $(JOBS) -LE no-asan

check: oracles
	@$(MAKE) --no-print-directory all asan
	@echo "== sanitizer build (ASan+UBSan) ==" && cd $(ASAN_BUILD) && ctest --output-on-failure -j $(JOBS) -LE no-asan
	@echo "== release build ==" && cd $(BUILD) && ctest --output-on-failure -j $(JOBS)

clean:
	rm -rf $(BUILD) $(ASAN_BUILD)
