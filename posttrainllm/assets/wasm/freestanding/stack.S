# tg_set_stack(top): point this instance's stack pointer at `top`. A worker of the threaded
# freestanding build shares the module's memory but has its own __stack_pointer global, which
# starts where the first instance's does; its JavaScript calls this first, with the top of a
# stack allocated for it. C cannot name the global, so this is WebAssembly text.
	.globaltype	__stack_pointer, i32
	.text
	.globl	tg_set_stack
	.type	tg_set_stack,@function
tg_set_stack:
	.functype	tg_set_stack (i32) -> ()
	local.get	0
	global.set	__stack_pointer
	end_function
