"""Starting a job's processes: on this machine (`local`; `proc` is a child's main), in
threads for tests (`threads`), or as Ray actors (`ray_cluster`, `ray_actor`); `cgroup`
caps a process's CPUs. The one package that imports all three roles."""
