# What `cmake --install` adds beside the programs and libraries (man pages,
# systemd units, docs), and the Debian package of it all: scripts/package
# configures a build with CMAKE_INSTALL_PREFIX=/usr and runs `cpack -G DEB`
# (docs/OPERATIONS.md, "Installing the Debian package").

# The units name the installed membrokerd.
configure_file(${PROJECT_SOURCE_DIR}/packaging/membrokerd.service.in ${PROJECT_BINARY_DIR}/packaging/membrokerd.service
  @ONLY)
install(FILES ${PROJECT_BINARY_DIR}/packaging/membrokerd.service ${PROJECT_SOURCE_DIR}/packaging/membrokerd.socket
  DESTINATION lib/systemd/system)

# Man pages, compressed as Debian policy asks (gzip -9n: no name or time in the header).
find_program(GZIP gzip REQUIRED)
set(_mb_man_pages)
foreach(page membrokerd.8 membrokerctl.1 membroker-share.1)
  configure_file(${PROJECT_SOURCE_DIR}/packaging/man/${page} ${PROJECT_BINARY_DIR}/packaging/man/${page} @ONLY)
  set(gz ${PROJECT_BINARY_DIR}/packaging/man/${page}.gz)
  add_custom_command(OUTPUT ${gz}
    COMMAND ${GZIP} -9nc ${PROJECT_BINARY_DIR}/packaging/man/${page} > ${gz}
    DEPENDS ${PROJECT_BINARY_DIR}/packaging/man/${page} VERBATIM)
  string(REGEX REPLACE ".*\\." "" section ${page})
  install(FILES ${gz} DESTINATION ${CMAKE_INSTALL_MANDIR}/man${section})
  list(APPEND _mb_man_pages ${gz})
endforeach()
add_custom_target(membroker_man_pages ALL DEPENDS ${_mb_man_pages})

# The operator's and user's documentation, where the units' Documentation= points.
file(GLOB _mb_docs ${PROJECT_SOURCE_DIR}/docs/*.md)
install(FILES ${PROJECT_SOURCE_DIR}/README.md ${_mb_docs} ${PROJECT_SOURCE_DIR}/packaging/debian/copyright
  DESTINATION ${CMAKE_INSTALL_DOCDIR})

# The Debian package.
set(CPACK_GENERATOR DEB)
set(CPACK_PACKAGE_NAME membroker)
set(CPACK_PACKAGE_VERSION ${PROJECT_VERSION})
set(CPACK_PACKAGE_CONTACT "membroker maintainers <maintainers@membroker.example.org>")
set(CPACK_PACKAGING_INSTALL_PREFIX ${CMAKE_INSTALL_PREFIX})
set(CPACK_DEBIAN_FILE_NAME DEB-DEFAULT)  # membroker_VERSION_amd64.deb
set(CPACK_DEBIAN_PACKAGE_SECTION admin)
set(CPACK_DEBIAN_PACKAGE_PRIORITY optional)
set(CPACK_DEBIAN_PACKAGE_HOMEPAGE "https://membroker.example.org/")
set(CPACK_PACKAGE_DESCRIPTION_SUMMARY "cross-process shared memory broker")
set(CPACK_DEBIAN_PACKAGE_DESCRIPTION "membrokerd owns physical memory (memfd host memory in normal or huge pages,
pinned host memory, CUDA device memory) and exports it to client processes
over a Unix socket. It counts references per client and frees what a crashed
client held. This package holds the daemon and its systemd units,
membrokerctl, the C and C++ client library with its headers, pkg-config and
CMake files, and the Python module.")
set(CPACK_STRIP_FILES ON)
set(CPACK_DEBIAN_PACKAGE_SHLIBDEPS ON)          # Depends from the binaries' libraries
set(CPACK_DEBIAN_PACKAGE_GENERATE_SHLIBS ON)    # and a shlibs file for packages built on libmembroker
set(CPACK_DEBIAN_PACKAGE_GENERATE_SHLIBS_POLICY ">=")
set(CPACK_DEBIAN_PACKAGE_CONTROL_STRICT_PERMISSION ON)
# The loader cache follows libmembroker through dpkg's ldconfig trigger;
# our own postinst and postrm (systemd's daemon-reload) keep cpack from
# generating ones that call ldconfig, which Debian replaced with the trigger.
set(CPACK_DEBIAN_PACKAGE_CONTROL_EXTRA ${PROJECT_SOURCE_DIR}/packaging/debian/triggers
  ${PROJECT_SOURCE_DIR}/packaging/debian/postinst ${PROJECT_SOURCE_DIR}/packaging/debian/postrm)
if(MEMBROKER_PYTHON_MINOR)
  # The extension module is built for one Python: this minor version, with numpy for tensors.
  math(EXPR _mb_next_minor "${MEMBROKER_PYTHON_MINOR} + 1")
  set(CPACK_DEBIAN_PACKAGE_DEPENDS
    "python3 (>= 3.${MEMBROKER_PYTHON_MINOR}), python3 (<< 3.${_mb_next_minor}), python3-numpy, ")
endif()
string(APPEND CPACK_DEBIAN_PACKAGE_DEPENDS "adduser")  # postinst: addgroup --system membroker
set(CPACK_DEBIAN_PACKAGE_SUGGESTS "python3-torch, prometheus")

# Debian's changelog, dated by SOURCE_DATE_EPOCH where set (reproducible builds).
string(TIMESTAMP MEMBROKER_CHANGELOG_DATE "%a, %d %b %Y %H:%M:%S +0000" UTC)
configure_file(${PROJECT_SOURCE_DIR}/packaging/debian/changelog.in ${PROJECT_BINARY_DIR}/packaging/changelog @ONLY)
add_custom_command(OUTPUT ${PROJECT_BINARY_DIR}/packaging/changelog.gz
  COMMAND ${GZIP} -9nc ${PROJECT_BINARY_DIR}/packaging/changelog > ${PROJECT_BINARY_DIR}/packaging/changelog.gz
  DEPENDS ${PROJECT_BINARY_DIR}/packaging/changelog VERBATIM)
add_custom_target(membroker_changelog ALL DEPENDS ${PROJECT_BINARY_DIR}/packaging/changelog.gz)
install(FILES ${PROJECT_BINARY_DIR}/packaging/changelog.gz DESTINATION ${CMAKE_INSTALL_DOCDIR})
install(FILES ${PROJECT_SOURCE_DIR}/packaging/debian/lintian-overrides DESTINATION ${CMAKE_INSTALL_DATADIR}/lintian/overrides
  RENAME membroker)

include(CPack)
