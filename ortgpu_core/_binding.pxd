cdef class _BindingView:
    cdef object _session  # the InferenceSession (the public .session)
    cdef object _owner  # its runner: a BindingOwner (ortgpu_core._owner), what this module calls
    cdef dict _inputs
    cdef dict _outputs
    cdef dict _cpu_inputs
    cdef dict _session_outputs  # name -> device type: outputs the session allocates (bind_output(name[, device]))
    cdef dict _session_results  # name -> the value the session allocated for it in the last run
    cdef object __weakref__

cdef class IOBinding(_BindingView):
    cdef list _captured_by
    cdef object _lock
    cdef int _check_mutable(self, str what) except -1

cdef class FrozenIOBinding(_BindingView):
    cdef IOBinding _origin
