# The README's two commands, and what CI runs after its lint steps:
#
#   make demo   go run ./examples/orders
#   make test   install what the tests need when absent (scripts/test-deps), then the tests of every module
.PHONY: test demo test-deps

test: test-deps
	go test -race work

test-deps:
	bash scripts/test-deps

demo:
	go run ./examples/orders
